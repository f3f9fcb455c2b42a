"""Tenants and cohorts as the dashboard shows them (pure), from the tenancy in force, quota's usage rows,
its decayed history and the waiting jobs.

Units: quota units per flavor (``gpusched_core.quota.units``: one GPU is ``UNITS_PER_GPU`` = 7000 units, so a
milli share and a MIG slice are exact integers); usage across flavors is in GPU-equivalents (GEQ:
units / 7000 * the flavor's ``gpu_equivalents``).

- ``fair_share``: the part of its cohort's capacity the tenant is entitled to, ``weight * nominal GEQ``
  over the sum of the same over the cohort's leaves (None: no tenancy, an unknown tenant, or a cohort with
  no nominal quota). It is the entitlement the fair-share planner divides by (``quota.dominant_share``).
- ``decayed_usage``: the decayed average GEQ the planner ranks by, the tenant's history advanced to ``now``
  at its reserved rate (``quota.history_now``), summed over flavors; ``dominant_share`` is the planner's
  measure itself (None without a tenancy).
- ``pending_gpus``: what the tenant's waiting jobs ask for, in GPUs: whole GPUs x nodes, a share's
  milli / 1000, a MIG instance's compute slices / 7.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_core.placement.mig import MIG_COMPUTE_SLICES, parse_mig_profile
from gpusched_core.placement.model import MILLI_PER_GPU
from gpusched_core.quota import UNITS_PER_GPU, QuotaSnapshot, Tenancy, UsageHistory, gpu_equivalents
from gpusched_core.quota.decay import average_rate
from gpusched_core.quota.jobs import cohort_members, cohort_of
from gpusched_core.quota.snapshot import dominant_share, history_now

UNITS = {"name": "quota units", "per_gpu": UNITS_PER_GPU,
         "explain": f"flavor amounts are quota units: one GPU of the flavor is {UNITS_PER_GPU} units (a milli "
                    "share and a MIG slice are whole units); decayed_usage is in GPU-equivalents"}


@dataclass(frozen=True, slots=True)
class PendingRow:
    """A waiting job's tenant and shape (as ``placement_pending``/``quota_policy_pending`` store it)."""

    tenant: str
    gpus: int
    nodes: int = 1
    share_milli: int | None = None
    mig_profile: str | None = None

    @property
    def gpus_asked(self) -> float:
        if self.share_milli is not None:
            return self.share_milli / MILLI_PER_GPU
        if self.mig_profile is not None:
            try:
                return parse_mig_profile(self.mig_profile)[0] / MIG_COMPUTE_SLICES
            except ValueError:
                return 0.0
        return float(self.gpus * max(1, self.nodes))


def _entitlement(tenancy: Tenancy, tenant: str) -> float:
    spec = tenancy.tenants[tenant]
    return spec.weight * sum(gpu_equivalents(tenancy.nominal_units(tenant, f), f, tenancy.gpu_equivalents)
                             for f in tenancy.flavors)


def plan_tenants(tenancy: Tenancy | None, usage: Iterable[Mapping], history: Mapping[str, UsageHistory],
                 pending: Iterable[PendingRow], now_s: float, scoped: str | None) -> dict:
    """``{"units", "tenants", "cohorts"}``: ``usage`` rows are ``quota_policy_usage``'s (tenant, flavor,
    reserved_units, nominal_units, limit_units); ``scoped``: only that tenant and its cohort (None: all)."""
    rows = [dict(r) for r in usage]
    flavors: dict[str, list[dict]] = {}
    reserved: dict[str, dict[str, int]] = {}
    for r in rows:
        flavors.setdefault(r["tenant"], []).append(
            {"flavor": r["flavor"], "reserved_units": r["reserved_units"], "nominal_units": r["nominal_units"],
             "limit_units": r["limit_units"], "borrowed_units": max(0, r["reserved_units"] - r["nominal_units"])})
        reserved.setdefault(r["tenant"], {})[r["flavor"]] = r["reserved_units"]
    waiting: dict[str, list[float]] = {}
    for p in pending:
        waiting.setdefault(p.tenant, []).append(p.gpus_asked)
    names = set(flavors) | set(waiting) | (set(tenancy.leaves()) if tenancy is not None else set())
    if scoped is not None:
        names &= {scoped}
    snapshot = QuotaSnapshot(tenancy, reserved, history, now_s) if tenancy is not None else None
    tenants = [_tenant(name, tenancy, snapshot, flavors.get(name, []), waiting.get(name, [])) for name in sorted(names)]
    cohorts = sorted({t["cohort"] for t in tenants})
    return {"units": UNITS, "tenants": tenants,
            "cohorts": [_cohort(c, tenancy, rows) for c in cohorts]}


def _tenant(name: str, tenancy: Tenancy | None, snapshot: QuotaSnapshot | None, flavors: list[dict],
            waiting: list[float]) -> dict:
    known = tenancy is not None and name in tenancy.tenants
    cohort = cohort_of(tenancy, name) if tenancy is not None else name
    fair = decayed = dominant = None
    if known and tenancy is not None and snapshot is not None:
        total = sum(_entitlement(tenancy, m) for m in cohort_members(tenancy, cohort))
        fair = round(_entitlement(tenancy, name) / total, 6) if total else None
        now = history_now(snapshot, name)
        decayed = round(sum(average_rate(now, f, tenancy.half_life_s) for f in now.geq_s), 6)
        dominant = round(dominant_share(snapshot, name), 6)
    return {"tenant": name, "cohort": cohort, "weight": tenancy.tenants[name].weight if known and tenancy else None,
            "fair_share": fair, "decayed_usage": decayed, "dominant_share": dominant,
            "pending_jobs": len(waiting), "pending_gpus": round(sum(waiting), 4), "flavors": flavors}


def _cohort(cohort: str, tenancy: Tenancy | None, rows: list[dict]) -> dict:
    members = cohort_members(tenancy, cohort) if tenancy is not None else (cohort,)
    mine = [r for r in rows if r["tenant"] in members]
    return {"cohort": cohort, "tenants": list(members), "nominal_units": sum(r["nominal_units"] for r in mine),
            "reserved_units": sum(r["reserved_units"] for r in mine)}
