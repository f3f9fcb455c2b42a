"""Fair entitlements and the deficit share the fair-share order ranks tenants by.

A tenant's *fair entitlement* of a flavor is its weighted max-min share of its cohort's pool of that
flavor: the pool (``tree.pool`` at the root) is water-filled over the cohort's leaves in proportion to
``weight * nominal`` (one GPU's worth for a tenant with no nominal quota of the flavor), each capped by
its demand (reserved + pending units) and by what it may ever hold (nominal + borrowing limit). So a
tenant's entitlement grows past its nominal quota when others leave theirs idle, and is never below
``min(demand, nominal)`` (the weights are the nominal quotas, whose sum is the pool).

``fair_share`` is the tenant's deficit against that entitlement, the largest over flavors of
``max(reserved now, decayed average) / entitlement`` (both in GPU-equivalents; see ``decay``). The
larger of the two, not their sum: a tenant that just started a large job is ranked by it at once, and
one that stopped keeps its recent average, so a tenant that runs in bursts is not ranked ahead of one
that holds the same share steadily (with the sum it would count only half as much). Below 1 the tenant
gets less than it is entitled to; a flavor it has no demand of is measured against its weighted
nominal quota as in ``snapshot.dominant_share``.

``fair_victim_tenants`` is the fair-share preemption rule the simulator applies (a rule in the sense of
Kueue's fair-sharing strategies): a waiting job may take runs only of tenants whose share exceeds, by
``margin``, what its own tenant's share becomes once the job runs; and only while running it keeps its
tenant within its entitlement. ``backfill_limit`` is the same rule seen from the other side: while
such a job waits for room (quota allows it, no node has it), no other tenant starts a run that takes its
share past the share at which that job could preempt it (a backfill that preemption would take back). Pure;
nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .decay import average_rate
from .queues import PendingQueue
from .snapshot import QuotaSnapshot, history_now
from .units import UNITS_PER_GPU, gpu_equivalents

DEFAULT_FAIR_PREEMPTION_MARGIN = 0.5  # what simulate-queue found on Philly at 32 nodes (0.3 to 1.0: within 0.004 in Jain)

Demand = Mapping[tuple[str, str], float]  # (tenant, flavor) -> units


def queue_demand(snapshot: QuotaSnapshot, queues: Iterable[PendingQueue]) -> dict[tuple[str, str], float]:
    """Reserved units of every leaf, plus the first-option units of its pending jobs."""
    waiting: dict[tuple[str, str], float] = {}
    for queue in queues:
        key = (queue.tenant, queue.flavor)
        waiting[key] = waiting.get(key, 0.0) + sum(job.ask.options[0][1] for _, job in queue.entries)
    return held_and_waiting(snapshot, waiting)


def held_and_waiting(snapshot: QuotaSnapshot, waiting: Demand) -> dict[tuple[str, str], float]:
    """Reserved units of every leaf, plus ``waiting`` (units asked for, per (tenant, flavor)); no zero entries."""
    demand: dict[tuple[str, str], float] = {}
    for tenant, row in snapshot.usage.items():
        for flavor, units in row.items():
            if units:
                demand[(tenant, flavor)] = demand.get((tenant, flavor), 0.0) + units
    for key, units in waiting.items():
        if units:
            demand[key] = demand.get(key, 0.0) + units
    return demand


def fair_entitlements(snapshot: QuotaSnapshot, demand: Demand) -> dict[tuple[str, str], float]:
    """Units each (known leaf, flavor) of ``demand`` is entitled to (module doc)."""
    tenancy = snapshot.tenancy
    tree = tenancy.tree
    groups: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}  # (root, flavor) -> tenant -> (cap, w)
    for (tenant, flavor), units in demand.items():
        spec = tenancy.tenants.get(tenant)
        if spec is None or not spec.is_leaf or flavor not in tree.pool or units <= 0:
            continue
        quota = spec.flavor_quota(flavor)
        cap = units if quota.borrowing_limit is None else min(units, quota.nominal + quota.borrowing_limit)
        weight = spec.weight * max(quota.nominal, UNITS_PER_GPU)
        groups.setdefault((tenancy.root_of(tenant), flavor), {})[tenant] = (cap, weight)
    out: dict[tuple[str, str], float] = {}
    for (root, flavor), members in groups.items():
        pool = tree.pool[flavor][tree.index[root]]
        for tenant, share in water_fill(pool, members).items():
            out[(tenant, flavor)] = share
    return out


def water_fill(capacity: float, members: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Weighted max-min shares of ``capacity`` over ``members`` (name -> (cap, weight))."""
    share = dict.fromkeys(members, 0.0)
    active = {t for t, (cap, _) in members.items() if cap > 0}
    left = float(capacity)
    while active and left > 1e-9:
        mass = sum(members[t][1] for t in active)
        offer = {t: left * members[t][1] / mass for t in active}
        capped = {t for t in active if members[t][0] - share[t] <= offer[t]}
        if not capped:
            for t in active:
                share[t] += offer[t]
            break
        for t in capped:
            left -= members[t][0] - share[t]
            share[t] = members[t][0]
        active -= capped
    return share


def fair_shares(snapshot: QuotaSnapshot, demand: Demand, tenants: Iterable[str] | None = None) -> dict[str, float]:
    """``fair_share`` of every given tenant (default: every tenant with demand)."""
    entitled = fair_entitlements(snapshot, demand)
    names = set(tenants) if tenants is not None else {t for t, _ in demand}
    return {name: fair_share(snapshot, name, entitled) for name in names}


def fair_share(snapshot: QuotaSnapshot, tenant: str, entitled: Mapping[tuple[str, str], float],
               extra_units: Mapping[str, int] | None = None) -> float:
    """The tenant's deficit share (module doc); ``extra_units`` per flavor are counted as reserved too
    (its share once a job runs)."""
    tenancy = snapshot.tenancy
    spec = tenancy.tenants.get(tenant)
    weight = spec.weight if spec is not None else 1.0
    usage = dict(snapshot.usage.get(tenant, {}))
    for flavor, units in (extra_units or {}).items():
        usage[flavor] = usage.get(flavor, 0) + units
    history = history_now(snapshot, tenant)
    share = 0.0
    for flavor in set(usage) | set(history.geq_s):
        held = gpu_equivalents(usage.get(flavor, 0), flavor, tenancy.gpu_equivalents)
        recent = average_rate(history, flavor, tenancy.half_life_s)
        units = entitled.get((tenant, flavor))
        if not units:
            nominal = tenancy.nominal_units(tenant, flavor) if spec is not None else 0
            units = weight * (nominal or UNITS_PER_GPU)
        share = max(share, max(held, recent) / gpu_equivalents(units, flavor, tenancy.gpu_equivalents))
    return share


def fair_victim_tenants(snapshot: QuotaSnapshot, shares: Mapping[str, float],
                        entitled: Mapping[tuple[str, str], float], tenant: str, flavor: str, units: int,
                        margin: float = DEFAULT_FAIR_PREEMPTION_MARGIN) -> frozenset[str]:
    """Tenants whose runs a pending job of ``tenant`` (``units`` of ``flavor``) may preempt by fair
    share (module doc); none when running it would take its tenant past its entitlement."""
    if snapshot.used(tenant, flavor) + units > entitled.get((tenant, flavor), 0.0) + 1e-9:
        return frozenset()
    after = fair_share(snapshot, tenant, entitled, {flavor: units})
    return frozenset(t for t, share in shares.items() if t != tenant and share > after * (1.0 + margin))



def backfill_limit(snapshot: QuotaSnapshot, entitled: Mapping[tuple[str, str], float], tenant: str, flavor: str,
                   units: int, margin: float = DEFAULT_FAIR_PREEMPTION_MARGIN) -> float:
    """The share above which no other tenant may start a run while a job of ``tenant`` (``units`` of
    ``flavor``) that quota allows waits for room on the nodes: ``(1 + margin)`` times its tenant's share
    once it runs, the share above which ``fair_victim_tenants`` lets it preempt (so nothing is started
    that fair-share preemption would take back); infinite when it may preempt nobody (it would take
    its tenant past its entitlement)."""
    if snapshot.used(tenant, flavor) + units > entitled.get((tenant, flavor), 0.0) + 1e-9:
        return math.inf
    return fair_share(snapshot, tenant, entitled, {flavor: units}) * (1.0 + margin)
