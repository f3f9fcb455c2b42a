"""Fair backfill: which tenants a simulated quota cycle gives no new runs once a job waits for room.

A job that quota allows but that no node has room for (typically a whole-node or gang job on a cluster
fragmented by small runs) is *blocked*. Without a rule, the room the cycle goes on handing out goes to
whatever fits, in order: on Philly, bursts of 1-GPU jobs of tenants with a few GPUs of quota filled
every hole, held four to eight times their fair entitlement for hours while tenants of gang jobs sat
under theirs, and fair-share preemption could rarely free a whole node (the holes refilled at once).
With it, the tenants that fair-share preemption may take runs from for a blocked job
(``gpusched_core.quota.fairness.held_back_tenants``) start nothing more in that cycle; everyone else
still backfills. One instance per cycle; it reads the state, it changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpusched_core.quota import PendingJob, PendingQueue, QuotaSnapshot
from gpusched_core.quota.fairness import fair_entitlements, fair_share, held_back_tenants, queue_demand

from .cluster import FLAVOR


class FairBackfill:
    """The cycle's fair entitlements and shares (every tenant with demand, queued or only running) and
    the tenants held back so far."""

    def __init__(self, snapshot: QuotaSnapshot, queues: Sequence[PendingQueue], margin: float) -> None:
        self.snapshot, self.margin = snapshot, margin
        demand = queue_demand(snapshot, queues)
        self.entitled = fair_entitlements(snapshot, demand)
        self.shares = {tenant: fair_share(snapshot, tenant, self.entitled) for tenant in {t for t, _ in demand}}
        self.held: frozenset[str] = frozenset()
        self._blocked_tenants: set[str] = set()

    def blocked(self, job: PendingJob) -> None:
        """Record that ``job`` fits quota but not the nodes; its tenant's first such job decides."""
        if job.tenant in self._blocked_tenants:
            return
        self._blocked_tenants.add(job.tenant)
        blocked = ((job.tenant, FLAVOR, job.ask.units),)
        self.held |= held_back_tenants(self.snapshot, self.shares, self.entitled, blocked, self.margin)

    def holds_back(self, job: PendingJob) -> bool:
        return job.tenant in self.held
