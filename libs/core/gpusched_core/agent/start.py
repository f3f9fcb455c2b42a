"""Whether a node agent starts the job a `StartJob` names (pure).

Rules, in this order:

1. The node recorded a run of this job before (`previous`). The command starts a new run only when it is
   a later attempt than that run and that run is over: its exit reported and its process gone (a run
   marked reported whose process still runs is not over, whatever the mark says); anything else is a
   redelivered or stale command and is ignored (the run it names already ran, or runs): a job never runs
   twice here. A new run sets the previous, reported one aside first (`rerun`).
2. The command names another lease epoch than the node's (its fencing token: placed before the agent
   restarted or regained its lease): ignore it; the node's ReconcileJobs settles the job.
3. The node's lease is fenced (lost, not yet re-acquired): refuse, `lease_lost`; placement may already
   have requeued the job elsewhere.
4. A GPU it asks for is unhealthy (cordoned): refuse, `gpu_unhealthy`, naming the GPUs.
5. Otherwise start it.

A refusal is reported as the job's exit (code 137, the reason code and the error below); an ignored
command reports nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpusched_common.events import ExitReason

# why a StartJob is ignored
RECORD_GONE = "record_gone"  # the earlier run's record vanished while it was looked at
STALE = "stale_attempt"  # an earlier attempt than the run recorded here
DUPLICATE = "duplicate"  # the attempt recorded here: a redelivered command
RUN_NOT_OVER = "run_not_over"  # the run recorded here still runs, or its exit is not reported yet
OTHER_EPOCH = "other_epoch"  # placed for another lease epoch of this node than the current one


@dataclass(frozen=True)
class PreviousRun:
    """The run of the job this node recorded (None where it recorded none)."""

    attempt: int | None  # None: the record disappeared between finding and reading it
    reported: bool  # its exit was reported
    alive: bool = False  # its process still runs (then the run is not over, reported or not)


@dataclass(frozen=True)
class NodeFacts:
    """What the decision needs to know of the node when the command arrives."""

    node_id: str
    lease_valid: bool
    unhealthy_gpus: Collection[int]
    lease_epoch: int | None = None  # the node's current lease epoch


@dataclass(frozen=True)
class Start:
    rerun: bool = False  # the job ran here before: set that (reported) run aside first


@dataclass(frozen=True)
class Refuse:
    reason_code: str
    error: str
    rerun: bool = False


@dataclass(frozen=True)
class Ignore:
    reason: str


StartDecision = Start | Refuse | Ignore


def decide_start(*, attempt: int, gpu_indices: Sequence[int], previous: PreviousRun | None,
                 node: NodeFacts, lease_epoch: int | None = None) -> StartDecision:
    """What to do with a StartJob of run `attempt` on `gpu_indices`, placed at the node's `lease_epoch`
    (None: not fenced), see the module's rules."""
    rerun = previous is not None
    if previous is not None:
        ignored = _ignored(attempt, previous)
        if ignored is not None:
            return Ignore(ignored)
    if lease_epoch is not None and node.lease_epoch is not None and lease_epoch != node.lease_epoch:
        return Ignore(OTHER_EPOCH)
    if not node.lease_valid:
        return Refuse(ExitReason.LEASE_LOST, f"{node.node_id} has lost its lease; the job was not started", rerun)
    sick = [i for i in gpu_indices if i in node.unhealthy_gpus]
    if sick:
        return Refuse(ExitReason.GPU_UNHEALTHY, f"GPU(s) {sick} on {node.node_id} are unhealthy; the job was not started",
                      rerun)
    return Start(rerun)


def _ignored(attempt: int, previous: PreviousRun) -> str | None:
    if previous.attempt is None:
        return RECORD_GONE
    if attempt < previous.attempt:
        return STALE
    if attempt == previous.attempt:
        return DUPLICATE
    if not previous.reported or previous.alive:
        return RUN_NOT_OVER
    return None
