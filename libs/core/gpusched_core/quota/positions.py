"""Where each job waiting for quota stands (pure): the quota cycle's own decision run on the state a cycle
reads, as a ranking for readers (``gpusched queue``, ``gpusched job``).

The quota service records why each job waits (``plan.reasons()``), not where: one arrival or release
moves every position behind it, so positions are worked out when someone asks. ``rank_cohort`` runs the
cycle's own decision (``plan_cycle``) and returns its ranking: the position in the cohort's queue (the
documented fair-share order: guaranteed work first, then priority class, dominant share, submission time,
job id), the waiting jobs of a higher priority class ahead, and the reason.

A job the plan would reserve at once arrived after the service's last cycle: it is listed first, as
next to be reserved. A job whose request cannot be charged at all comes last, without a position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_core.quota import QuotaSnapshot, Tenancy, UsageHistory, plan_cycle
from gpusched_core.quota.jobs import QueuedJob, as_guest, chargeable

NEXT_CYCLE = "fits quota; reserved at the quota service's next cycle"


@dataclass(frozen=True)
class QuotaQueueEntry:
    """``position``: 1-based in the cohort's queue (None: never considered, see ``reason``)."""

    job_id: str
    tenant: str
    cohort: str
    position: int | None
    ahead_higher_priority: int
    reason: str


def rank_cohort(tenancy: Tenancy, cohort: str, usage: Mapping[str, Mapping[str, int]],
                history: Mapping[str, UsageHistory], queued: Iterable[QueuedJob], now_s: float) -> list[QuotaQueueEntry]:
    """The cohort's waiting jobs in queue order (pure)."""
    jobs = {job.job_id: job for job in queued}
    pending, unchargeable = chargeable(tenancy, jobs.values())
    plan = plan_cycle(QuotaSnapshot(tenancy, usage, history, now_s), pending)
    entries = [QuotaQueueEntry(r.job_id, jobs[r.job_id].tenant, cohort, position, 0, NEXT_CYCLE)
               for position, r in enumerate(plan.reservations, start=1)]
    first = len(entries)
    entries += [QuotaQueueEntry(w.job_id, jobs[w.job_id].tenant, cohort, first + w.position, w.ahead_higher_priority,
                                as_guest(tenancy, jobs[w.job_id], w.reason)) for w in plan.waiting]
    entries += [QuotaQueueEntry(job_id, jobs[job_id].tenant, cohort, None, 0, reason)
                for job_id, reason in sorted(unchargeable)]
    return entries
