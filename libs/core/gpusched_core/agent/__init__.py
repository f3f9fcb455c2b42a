"""The node agent's decisions (pure): the shell in services/node_agent observes, calls these and acts.

- `start`: whether a StartJob starts the job, is refused (with the reason code and error it reports) or is
  ignored as redelivered or stale (`decide_start`).
- `stops`: preemptions, the GPU fault policy and the errors of the stops the agent causes.
- `reconcile`: what runs on the node against what should (restart, `ReconcileJobs`, a lost lease).
- `lease`: renewing, fencing and re-acquiring the node lease; monotonic times are passed in.
The reason codes of the exits the agent reports are the contract's ``ExitReason`` (gpusched_common.events).

Typical use, for a StartJob::

    match decide_start(attempt=cmd.attempt, gpu_indices=cmd.gpu_indices, previous=previous_run,
                       node=NodeFacts(node_id, lease.valid, unhealthy_gpus)):
        case Ignore():                     # a redelivered or stale command: report nothing
            ...
        case Refuse(reason_code, error):   # report the job's exit (137) with both
            ...
        case Start():                      # run it (set the previous run aside first when `rerun`)
            ...
"""

from .lease import Lease, acquire, check, renewed
from .reconcile import (
    Action,
    Adopt,
    Forget,
    ObservedJob,
    ReportExit,
    ReportMissing,
    Stop,
    answers_epoch,
    plan_reconcile,
)
from .start import Ignore, NodeFacts, PreviousRun, Refuse, Start, StartDecision, decide_start
from .stops import FaultResponse, Preempt, decide_gpu_fault, decide_preempt, stop_error

__all__ = [
    "Action", "Adopt",
    "FaultResponse", "Forget", "Ignore", "Lease", "NodeFacts", "ObservedJob", "Preempt", "PreviousRun",
    "Refuse", "ReportExit", "ReportMissing", "Start", "StartDecision", "Stop", "acquire", "answers_epoch",
    "check", "decide_gpu_fault", "decide_preempt", "decide_start", "plan_reconcile", "renewed", "stop_error",
]
