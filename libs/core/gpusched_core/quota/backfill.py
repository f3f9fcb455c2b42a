"""Fair backfill: whom a quota cycle starts no more while a job that quota allows waits for room.

A job that fits quota but that no node has room for (typically a whole-node or gang job on a cluster
fragmented by small runs) is *blocked*. Without a rule, the room a cycle goes on handing out goes to
whatever fits, in order: on Philly, bursts of 1-GPU jobs of tenants with a few GPUs of quota filled every
hole, held four to eight times their fair entitlement for hours while tenants of gang jobs sat under
theirs, and fair-share preemption could rarely free a whole node (the holes refilled at once). With it, no
other tenant starts a run of the blocked job's flavor, at or below its priority, that takes its fair
share past the blocked job's backfill limit (``fairness.backfill_limit``: the share above which that job
could preempt it); the share counts what the tenant was given earlier in the same cycle (shares that the
order holds fixed for a cycle would let a tenant take every GPU a burst of completions frees). Everyone
below the limit still backfills; a blocked tenant's own work is never held back by its own block.

Two callers: the replay (``gpusched_simulation.queue``) records a job the nodes refused in the same cycle,
its units not yet charged (``blocked``), and every queue's first job that asks for more than is free in
all (``blocked_heads``); the live quota service records the jobs it reserved that placement deferred for
want of room (``blocked_reserved``: their units already count in the tenant's usage). One instance per
cycle; it reads the snapshot, it changes nothing. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .fairness import backfill_limit, fair_entitlements, fair_share, queue_demand
from .ordering import PendingJob
from .queues import PendingQueue, priority_value
from .snapshot import QuotaSnapshot


@dataclass(frozen=True, slots=True)
class BlockedWork:
    """Work of ``tenant`` that quota reserved and that waits for room on the nodes (placement deferred it),
    of ``flavor`` and, at most, ``priority`` (a priority class's value)."""

    tenant: str
    flavor: str
    priority: int


@dataclass(frozen=True, slots=True)
class Hold:
    """Why a job is held back: its tenant's share once it starts (counting what the cycle gave it), past
    the ``limit`` of the blocked work of ``blocked_tenant``."""

    tenant: str
    share: float
    limit: float
    blocked_tenant: str

    def reason(self) -> str:
        return (f"fair share: tenant {self.tenant} would reach {self.share:.2f} of its fair share, past "
                f"{self.limit:.2f}, while a job of tenant {self.blocked_tenant} that fits its quota waits for "
                f"room on the nodes (no backfill past the share at which that job could preempt it)")


@dataclass(frozen=True, slots=True)
class _Limit:
    value: float
    priority: int


class FairBackfill:
    """The cycle's demand, fair entitlements and shares (every tenant with demand, queued or only running), the
    backfill limit of each blocked tenant's work per flavor, and what each tenant was given in the cycle."""

    def __init__(self, snapshot: QuotaSnapshot, queues: Sequence[PendingQueue], margin: float) -> None:
        self.snapshot, self.margin = snapshot, margin
        self.demand = queue_demand(snapshot, queues)
        self.entitled = fair_entitlements(snapshot, self.demand)
        self.shares = {tenant: fair_share(snapshot, tenant, self.entitled) for tenant in {t for t, _ in self.demand}}
        self._limits: dict[str, dict[str, _Limit]] = {}  # flavor -> blocked tenant -> its limit
        self._given: dict[tuple[str, str], int] = {}  # (tenant, flavor) -> units given this cycle
        self._seen: dict[tuple[str, str, int, int], Hold | None] = {}  # (tenant, flavor, priority, units) -> answer

    def blocked(self, job: PendingJob, flavor: str | None = None, units: int | None = None) -> None:
        """Record that ``job`` (not charged yet) fits quota but not the nodes; its tenant's first such
        job of a flavor decides the limit."""
        flavor, units = flavor or job.ask.options[0][0], job.ask.options[0][1] if units is None else units
        self._record(job.tenant, flavor, priority_value(self.snapshot.tenancy, job), units)

    def blocked_reserved(self, tenant: str, flavor: str, priority: int) -> None:
        """Record that ``tenant`` has work of ``flavor`` and ``priority`` reserved (its units already in
        the usage) that waits for room on the nodes."""
        self._record(tenant, flavor, priority, 0)

    def blocked_heads(self, queues: Sequence[PendingQueue], free_units: int) -> None:
        """Record every queue's first job that asks for more than ``free_units`` (all that is free): the
        cohort's quota skips it without asking the nodes, and no node has room for it."""
        for queue in queues:
            head = queue.entries[0][1]
            if head.ask.units > free_units:
                self.blocked(head)

    def _record(self, tenant: str, flavor: str, priority: int, units: int) -> None:
        limits = self._limits.setdefault(flavor, {})
        known = limits.get(tenant)
        if known is None:
            value = backfill_limit(self.snapshot, self.entitled, tenant, flavor, units, self.margin)
            limits[tenant] = _Limit(value, priority)
        elif priority > known.priority:
            limits[tenant] = _Limit(known.value, priority)
        self._seen.clear()

    def holds_back(self, job: PendingJob, flavor: str, units: int) -> Hold | None:
        """Whether starting ``job`` (``units`` of ``flavor``) would take its tenant past the limit of
        blocked work of another tenant of that flavor and at least its priority; why, or None."""
        limits = self._limits.get(flavor)
        if not limits:
            return None
        priority = priority_value(self.snapshot.tenancy, job)
        memo = (job.tenant, flavor, priority, units)  # a queue's jobs of one shape ask the same
        if memo in self._seen:
            return self._seen[memo]
        tenant, limit = None, math.inf
        for other, known in limits.items():
            if other != job.tenant and known.priority >= priority and known.value < limit:
                tenant, limit = other, known.value
        hold = None
        if tenant is not None:
            given = self._given.get((job.tenant, flavor), 0) + units
            share = fair_share(self.snapshot, job.tenant, self.entitled, {flavor: given})
            if share > limit:
                hold = Hold(job.tenant, share, limit, tenant)
        self._seen[memo] = hold
        return hold

    def started(self, tenant: str, flavor: str, units: int) -> None:
        """``tenant`` was given ``units`` of ``flavor`` in this cycle."""
        self._given[(tenant, flavor)] = self._given.get((tenant, flavor), 0) + units
        if self._seen:
            self._seen = {memo: hold for memo, hold in self._seen.items() if memo[0] != tenant}
