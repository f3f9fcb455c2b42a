"""Fair-share preemption for a job that holds quota and waits for room: whom it may take runs from, and
how much of each (pure).

The rule is the replay's (``quota.fairness.fair_victim_tenants``): a waiting job whose tenant stays within
its fair entitlement may take runs of tenants whose fair share is above its tenant's by more than the
margin. Here it becomes a ``FairShareTrigger`` for the selection core, whose budget per tenant is what the
tenant may lose: no more than keeps its held share (units over entitlement) at or above what the waiting
tenant's is once its job runs (so the preemption is never reversed by the victim's tenant), and no more than
it borrows (nobody is pushed under its nominal quota by someone else's work). A tenant with no budget
loses nothing; the core protects runs younger than the minimum run time it is given (the quantum: a tenant
over its share loses a run only after that run has had that long, which bounds the churn).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpusched_core.quota import QuotaSnapshot
from gpusched_core.quota.fairness import DEFAULT_FAIR_PREEMPTION_MARGIN, fair_entitlements, fair_share
from gpusched_core.quota.fairness import fair_victim_tenants

from .model import FairShareTrigger, SelectionConfig

Demand = Mapping[tuple[str, str], float]  # (tenant, flavor) -> units held and waiting


def fair_share_trigger(snapshot: QuotaSnapshot, demand: Demand, tenant: str, flavor: str, units: int,
                       margin: float = DEFAULT_FAIR_PREEMPTION_MARGIN) -> FairShareTrigger | None:
    """The trigger for a job of ``tenant`` holding ``units`` of ``flavor`` (counted in the snapshot's usage)
    that waits for room, or None when it may take nobody's runs. ``demand``: every tenant's units held and
    waiting (``fairness.queue_demand``, or the same summed by shape)."""
    entitled = fair_entitlements(snapshot, demand)
    shares = {name: fair_share(snapshot, name, entitled) for name in {name for name, _ in demand}}
    victims = fair_victim_tenants(snapshot, shares, entitled, tenant, flavor, 0, margin)
    mine = entitled.get((tenant, flavor), 0.0)
    if not victims or mine <= 0:
        return None
    final = snapshot.used(tenant, flavor) / mine  # its held share once its job runs (the job is counted)
    usage: dict[str, float] = {tenant: snapshot.used(tenant, flavor) - units}  # the core adds the job back
    weights: dict[str, float] = {tenant: mine}
    tenancy = snapshot.tenancy
    for name in sorted(victims):
        weight, held = entitled.get((name, flavor), 0.0), snapshot.used(name, flavor)
        budget = min(held - final * weight, held - tenancy.nominal_units(name, flavor))
        if weight > 0 and budget > 0:
            usage[name], weights[name] = final * weight + budget, weight  # the core's budget: usage - final x weight
    if len(usage) == 1:
        return None
    return FairShareTrigger(usage, weights)  # type: ignore[arg-type]  # units as floats: shares of entitlements


def fair_selection(config: SelectionConfig, quantum_s: float) -> SelectionConfig:
    """``config`` as fair-share preemption decides with it: enabled, and every run protected for at least the
    quantum (the live service's and the what-if replay's)."""
    return replace(config, fair_share_enabled=True, default_min_runtime_s=max(config.default_min_runtime_s, quantum_s),
                   min_runtime_s={name: max(s, quantum_s) for name, s in config.min_runtime_s.items()})
