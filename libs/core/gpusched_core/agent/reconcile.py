"""Reconcile what runs on a node against what should (pure): after a restart, on a `ReconcileJobs`
command, and when the lease is lost.

Inputs are the jobs the agent finds in its work directory (each with whether its process is alive and,
if it ended, its exit code) and the set of jobs the store says should run here (None: not known yet, in
which case the agent's own records are trusted). Rules, applied to each job in job id order:

1. lease lost: stop every live job (fencing: it may already be requeued elsewhere); report nothing now.
2. alive and wanted (or wanted unknown): adopt it (watch it and report its exit later).
3. alive and not wanted: stop it, report nothing (the store no longer expects it here).
4. ended, exit unreported, and wanted (or unknown): report its exit.
5. ended, exit unreported, not wanted: forget it (mark it reported).
6. wanted but unknown to the agent: report it missing, so it can be requeued.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpusched_common.events import ExitReason

__all__ = ["Action", "Adopt", "Forget", "ObservedJob", "ReportExit", "ReportMissing", "Stop", "answers_epoch",
           "plan_reconcile"]


@dataclass(frozen=True)
class ObservedJob:
    job_id: str
    pid: int
    alive: bool
    exit_code: int | None = None  # set when it ended with a recorded code
    reported: bool = False


@dataclass(frozen=True)
class Adopt:
    job_id: str


@dataclass(frozen=True)
class Stop:
    job_id: str
    reason_code: str


@dataclass(frozen=True)
class ReportExit:
    job_id: str
    exit_code: int


@dataclass(frozen=True)
class Forget:
    job_id: str


@dataclass(frozen=True)
class ReportMissing:
    job_id: str


Action = Adopt | Stop | ReportExit | Forget | ReportMissing


def plan_reconcile(observed: Iterable[ObservedJob], wanted: frozenset[str] | None, *,
                   lease_valid: bool = True) -> tuple[Action, ...]:
    actions: list[Action] = []
    known = set()
    for job in sorted(observed, key=lambda j: j.job_id):
        known.add(job.job_id)
        if job.reported and not job.alive:
            continue
        expected = wanted is None or job.job_id in wanted
        if job.alive:
            if not lease_valid:
                actions.append(Stop(job.job_id, ExitReason.LEASE_LOST))
            elif expected:
                actions.append(Adopt(job.job_id))
            else:
                actions.append(Stop(job.job_id, ExitReason.NOT_ASSIGNED))
        elif expected and lease_valid:
            actions.append(ReportExit(job.job_id, job.exit_code if job.exit_code is not None else 137))
        elif not expected:
            actions.append(Forget(job.job_id))
    if wanted is not None and lease_valid:
        actions.extend(ReportMissing(job_id) for job_id in sorted(wanted - known))
    return tuple(actions)


def answers_epoch(answer_epoch: int | None, epoch: int) -> bool:
    """Whether a `ReconcileJobs` answers the agent's current lease epoch; an answer to another epoch (or
    to none) describes a node that no longer exists, or nobody's: it is ignored (it would stop every job)."""
    return answer_epoch == epoch
