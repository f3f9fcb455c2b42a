"""What a quota decision reads: the tenancy, reserved usage, decayed history and the time.

``dominant_share`` is the fair-share measure: for each flavor, (reserved GEQ now + decayed average
GEQ) divided by the tenant's weighted entitlement (``weight * nominal`` in GEQ), and the largest of
these over flavors. A flavor the tenant has no nominal quota of counts as if it had one GPU's worth,
so borrowing a flavor one does not own ranks a tenant behind the owners.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .decay import UsageHistory, advance, average_rate
from .model import Tenancy
from .units import UNITS_PER_GPU, gpu_equivalents

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class QuotaSnapshot:
    """``usage``: reserved units per leaf tenant per flavor. ``history``: decayed usage per tenant
    (missing = none). ``now_s``: the decision time, seconds on the same epoch as the history."""

    tenancy: Tenancy
    usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    history: Mapping[str, UsageHistory] = field(default_factory=dict)
    now_s: float = 0.0

    def used(self, tenant: str, flavor: str) -> int:
        return self.usage.get(tenant, _EMPTY).get(flavor, 0)


def rate_geq(tenancy: Tenancy, usage: Mapping[str, int]) -> dict[str, float]:
    """A tenant's reserved usage (units per flavor) as GEQ per flavor."""
    return {f: gpu_equivalents(u, f, tenancy.gpu_equivalents) for f, u in usage.items() if u}


def history_now(snapshot: QuotaSnapshot, tenant: str) -> UsageHistory:
    """The tenant's history advanced to ``now_s`` at its current reserved rate."""
    tenancy = snapshot.tenancy
    past = snapshot.history.get(tenant)
    if past is None:
        return UsageHistory(snapshot.now_s)
    return advance(past, snapshot.now_s, rate_geq(tenancy, snapshot.usage.get(tenant, _EMPTY)),
                   tenancy.half_life_s)


def dominant_share(snapshot: QuotaSnapshot, tenant: str) -> float:
    tenancy = snapshot.tenancy
    spec = tenancy.tenants.get(tenant)
    weight = spec.weight if spec is not None else 1.0
    usage = snapshot.usage.get(tenant, _EMPTY)
    history = history_now(snapshot, tenant)
    share = 0.0
    for flavor in set(usage) | set(history.geq_s):
        held = gpu_equivalents(usage.get(flavor, 0), flavor, tenancy.gpu_equivalents)
        held += average_rate(history, flavor, tenancy.half_life_s)
        nominal = tenancy.nominal_units(tenant, flavor) if spec is not None else 0
        owned = gpu_equivalents(nominal or UNITS_PER_GPU, flavor, tenancy.gpu_equivalents)
        share = max(share, held / (weight * owned))
    return share


def dominant_shares(snapshot: QuotaSnapshot, tenants: object = None) -> dict[str, float]:
    """Dominant share of every leaf tenant (or of the given tenants)."""
    names = tenants if tenants is not None else snapshot.tenancy.leaves()
    return {name: dominant_share(snapshot, name) for name in names}  # type: ignore[union-attr]
