"""Reconcile what runs on a node against what should (pure): after a restart, on a `ReconcileJobs`
command, and when the lease is lost.

Inputs are the jobs the agent finds in its work directory (each with whether its process is alive and,
if it ended, its exit code) and the set of jobs the store says should run here (None: not known yet, in
which case the agent's own records are trusted). Rules, applied to each job in job id order:

1. lease lost: stop every live job (fencing: it may already be requeued elsewhere); report nothing now.
2. alive and an agent began to stop it (the reason is kept in the work directory; that agent may have died
   before the job ended, or even before it signalled it): stop it for that reason.
3. alive and wanted (or wanted unknown): adopt it (watch it and report its exit later).
4. alive and not wanted: stop it, report nothing (the store no longer expects it here).
5. ended, exit unreported, and wanted (or unknown): report its exit, with the reason an agent stopped it
   for (kept in the work directory: the agent that stopped it may have been restarted since).
6. ended, exit unreported, not wanted (or stopped because it was not): forget it (mark it reported).
7. wanted but unknown to the agent: report it missing, so it can be requeued.
8. ended, exit reported, and still wanted (a known list, not None): the report was lost after the broker
   took it (a broker that lost its data): send the same report again.

A job is wanted as a run (its attempt) where the store says which: a run of another attempt here (the job
was requeued and placed on this node again, and the agent never started the new run: wiped, or it missed
the StartJob) is not the wanted one. It is treated as not wanted (stopped if alive, forgotten if its exit
is unreported, left alone if reported) and the wanted run is reported missing, so the job is requeued; its
old exit sent again would be ignored as another run's, and the store would expect the job here for good.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_common.events import ExitReason

__all__ = ["Action", "Adopt", "Forget", "ObservedJob", "ReportExit", "ReportMissing", "ResendExit", "Stop",
           "answers_epoch", "plan_reconcile"]


@dataclass(frozen=True)
class ObservedJob:
    job_id: str
    pid: int
    alive: bool
    exit_code: int | None = None  # set when it ended with a recorded code
    reported: bool = False
    stop_reason: str | None = None  # the ExitReason an agent stopped it for (kept in its work directory)
    attempt: int | None = None  # the run it is (None: not recorded)


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
    reason_code: str | None = None  # why an agent stopped it, when one did


@dataclass(frozen=True)
class ResendExit:
    job_id: str


@dataclass(frozen=True)
class Forget:
    job_id: str


@dataclass(frozen=True)
class ReportMissing:
    job_id: str


Action = Adopt | Stop | ReportExit | ResendExit | Forget | ReportMissing


def plan_reconcile(observed: Iterable[ObservedJob], wanted: frozenset[str] | None, *,
                   lease_valid: bool = True, attempts: Mapping[str, int] | None = None) -> tuple[Action, ...]:
    """``attempts``: the run the store wants of each wanted job, where it says (None or absent: any run)."""
    actions: list[Action] = []
    known = set()
    observed = sorted(observed, key=lambda j: j.job_id)
    # a run of another attempt than the wanted one is not it: the wanted run is missing
    missing = {j.job_id for j in observed if j.job_id in wanted and _other_run(j, attempts)} \
        if wanted is not None and attempts else set()
    if missing:
        wanted = wanted - missing
    for job in observed:
        if job.job_id not in missing:
            known.add(job.job_id)
        if job.reported and not job.alive:
            if wanted is not None and job.job_id in wanted and lease_valid:
                actions.append(ResendExit(job.job_id))
            continue
        expected = wanted is None or job.job_id in wanted
        if job.alive:
            if not lease_valid:
                actions.append(Stop(job.job_id, ExitReason.LEASE_LOST))
            elif job.stop_reason is not None:  # an earlier agent began to stop it: the stop goes on
                actions.append(Stop(job.job_id, job.stop_reason))
            elif expected:
                actions.append(Adopt(job.job_id))
            else:
                actions.append(Stop(job.job_id, ExitReason.NOT_ASSIGNED))
        elif expected and lease_valid and job.stop_reason != ExitReason.NOT_ASSIGNED:
            actions.append(ReportExit(job.job_id, job.exit_code if job.exit_code is not None else 137,
                                      job.stop_reason))
        elif not expected or job.stop_reason == ExitReason.NOT_ASSIGNED:
            actions.append(Forget(job.job_id))
    if wanted is not None and lease_valid:
        actions.extend(ReportMissing(job_id) for job_id in sorted((wanted | missing) - known))
    return tuple(actions)


def _other_run(job: ObservedJob, attempts: Mapping[str, int]) -> bool:
    want = attempts.get(job.job_id)
    return want is not None and job.attempt is not None and job.attempt != want


def answers_epoch(answer_epoch: int | None, epoch: int) -> bool:
    """Whether a `ReconcileJobs` answers the agent's current lease epoch; an answer to another epoch (or
    to none) describes a node that no longer exists, or nobody's: it is ignored (it would stop every job)."""
    return answer_epoch == epoch
