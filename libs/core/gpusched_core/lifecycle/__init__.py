"""The job lifecycle as a pure decider, shared by every service (DESIGN.md section 4; ARCHITECTURE.md).

    Submitted -> Admitted | Rejected   (no status Submitted: JobSubmitted comes with JobAdmitted, a
                                        rejection is JobRejected alone)
    Admitted -> Queued (quota reserved) -> Placed -> Running -> Succeeded | Failed | Cancelled
    Placed -> Succeeded | Failed   (its exit was reported before its start)
    Placed | Running | Preempting -> Queued (requeued: its node was lost or its GPU failed)
    Placed | Running -> Preempting -> Preempted -> (quota released) Admitted -> Queued -> ... resumes from
    its last checkpoint
    Admitted | Queued -> Held (quota given back) -> Admitted (released, at its submission time)
    any state but a terminal one -> Cancelled; one holding GPUs (Placed, Running, Preempting) is first
    asked to stop (JobCancelRequested) and ends Cancelled when its exit is reported or its node is lost

Typical use, in a handler (the shell loads the state and appends the events)::

    from gpusched_core import lifecycle

    events = lifecycle.decide(state, lifecycle.Place(node_id, gpu_indices, ...), now)

- `state`: `JobState`, `JobStatus`, `evolve(state, event)` (folds one event into the state), `fold`.
- `commands`: one dataclass per command, and their union `Command`.
- `decisions`: `decide(state, command, now)` returns the events a command produces (an empty tuple when the
  command was already applied, so redelivery is harmless) and raises `InvalidTransition` when the command
  makes no sense in the current state. Both `decide` and `evolve` are pure.
"""

from .commands import (
    Cancel, Command, DeferPlacement, DeferQuota, Hold, Member, Release, Place, RecordCheckpoint, RecordExit, RecordStart,
    RegisterSubmission, ReleaseQuota, Requeue, RequestPreemption, ReserveQuota, SelectVictims,
)
from .decisions import InvalidTransition, decide
from .state import HOLDS_GPUS, TERMINAL, JobState, JobStatus, evolve, fold

__all__ = [
    "Cancel", "Command", "DeferPlacement", "DeferQuota", "Hold", "Member", "Release", "Place", "RecordCheckpoint", "RecordExit",
    "RecordStart", "RegisterSubmission", "ReleaseQuota", "Requeue", "RequestPreemption", "ReserveQuota",
    "SelectVictims", "InvalidTransition", "decide", "HOLDS_GPUS", "TERMINAL", "JobState", "JobStatus", "evolve",
    "fold",
]
