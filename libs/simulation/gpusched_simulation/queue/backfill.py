"""Fair backfill: which jobs a simulated quota cycle starts no more once a job waits for room.

A job that quota allows but that no node has room for (typically a whole-node or gang job on a cluster
fragmented by small runs) is *blocked*; so is a tenant's first job that asks for more GPUs than are free
in all (the cohort's quota, which is the cluster here, skips it without asking the nodes). Without a
rule, the room the cycle goes on handing out goes to whatever fits, in order: on Philly, bursts of 1-GPU
jobs of tenants with a few GPUs of quota filled every hole, held four to eight times their fair
entitlement for hours while tenants of gang jobs sat under theirs, and fair-share preemption could
rarely free a whole node (the holes refilled at once). With it, no other tenant starts a run that takes
its fair share past the blocked job's backfill limit (``gpusched_core.quota.fairness.backfill_limit``:
the share above which that job could preempt it); the share counts what the tenant was given earlier in
the same cycle (shares that the order holds fixed for a cycle would let a tenant take every GPU a burst
of completions frees). Everyone below the limit still backfills. One instance per cycle; it reads the
state, it changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpusched_core.quota import PendingJob, PendingQueue, QuotaSnapshot
from gpusched_core.quota.fairness import backfill_limit, fair_entitlements, fair_share, queue_demand

from .cluster import FLAVOR


class FairBackfill:
    """The cycle's fair entitlements and shares (every tenant with demand, queued or only running), the
    backfill limit of each tenant's first blocked job, and what each tenant was given in the cycle."""

    def __init__(self, snapshot: QuotaSnapshot, queues: Sequence[PendingQueue], margin: float) -> None:
        self.snapshot, self.margin = snapshot, margin
        demand = queue_demand(snapshot, queues)
        self.entitled = fair_entitlements(snapshot, demand)
        self.shares = {tenant: fair_share(snapshot, tenant, self.entitled) for tenant in {t for t, _ in demand}}
        self._limits: dict[str, float] = {}  # blocked tenant -> its first blocked job's limit
        self._given: dict[str, int] = {}

    def blocked(self, job: PendingJob) -> None:
        """Record that ``job`` fits quota but not the nodes; its tenant's first such job decides."""
        if job.tenant not in self._limits:
            self._limits[job.tenant] = backfill_limit(self.snapshot, self.entitled, job.tenant, FLAVOR,
                                                      job.ask.units, self.margin)

    def blocked_heads(self, queues: Sequence[PendingQueue], free_units: int) -> None:
        """Record every queue's first job that asks for more than ``free_units`` (all that is free): the
        cohort's quota skips it without asking the nodes, and no node has room for it."""
        for queue in queues:
            head = queue.entries[0][1]
            if head.ask.units > free_units:
                self.blocked(head)

    def holds_back(self, job: PendingJob) -> bool:
        """Whether starting ``job`` would take its tenant past the limit of a blocked job of another."""
        limit = min((v for t, v in self._limits.items() if t != job.tenant), default=math.inf)
        if limit == math.inf:
            return False
        extra = {FLAVOR: self._given.get(job.tenant, 0) + job.ask.units}
        return fair_share(self.snapshot, job.tenant, self.entitled, extra) > limit

    def started(self, job: PendingJob, units: int) -> None:
        self._given[job.tenant] = self._given.get(job.tenant, 0) + units
