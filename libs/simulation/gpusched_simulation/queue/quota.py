"""The tenancy a ``simulate-queue`` run enforces: one cohort (the cluster) whose teams are the trace's
virtual clusters, with nominal quotas in proportion to their nodes or GPU-hours."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpusched_core.quota import QuotaBook, Tenancy, gpus_to_units, parse_tenancy

from ..traces.philly import TraceJob, Workload
from .cluster import FLAVOR

COHORT = "philly"


@dataclass(frozen=True)
class QuotaSetup:
    nominal_gpus: Mapping[str, int]
    borrowing_limit_gpus: int | None


def tenancy_for(setup: QuotaSetup, half_life_s: float) -> Tenancy:
    """One cohort (the cluster) whose teams are the trace's virtual clusters."""
    teams = [{"name": tenant,
              "quota": {FLAVOR: {"nominal": gpus, "borrowing_limit": setup.borrowing_limit_gpus}}}
             for tenant, gpus in sorted(setup.nominal_gpus.items())]
    doc = {"version": 1, "priority_classes": {"batch": 0}, "fair_share": {"half_life_s": half_life_s},
           "tenants": [{"name": COHORT, "children": teams}]}
    return parse_tenancy(doc)


def quota_setup(weights: Mapping[str, float], cluster_gpus: int, borrow_pct: float | None) -> QuotaSetup:
    nominal = apportion(cluster_gpus, weights)
    limit = None if borrow_pct is None else int(round(cluster_gpus * borrow_pct / 100.0))
    return QuotaSetup(nominal, limit)


def schedulable(jobs: Sequence[TraceJob], tenancy: Tenancy, cluster_gpus: int) -> tuple[list[TraceJob], int]:
    """Jobs that could ever run (fit the cluster and their tenant's most-ever quota); and how many not."""
    book = QuotaBook.from_usage(tenancy, {})
    keep = [j for j in jobs if j.gpus <= cluster_gpus and gpus_to_units(j.gpus) <= book.most_ever(j.tenant, FLAVOR)]
    return keep, len(jobs) - len(keep)


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` whole units in proportion to ``weights`` (largest remainder; ties by name)."""
    positive = {k: w for k, w in weights.items() if w > 0}
    mass = sum(positive.values())
    if not positive or mass <= 0:
        return {k: 0 for k in weights}
    exact = {k: total * w / mass for k, w in positive.items()}
    out = {k: int(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return {k: out.get(k, 0) for k in weights}


def quota_weights(workload: Workload, basis: str, vc_nodes: Mapping[str, int]) -> dict[str, float]:
    """Per tenant of the workload: its node count (``nodes``; 0 for a VC not in the table) or its
    GPU-hours in the window (``gpu-hours``)."""
    tenants = sorted({job.tenant for job in workload.jobs})
    if basis == "nodes":
        return {t: float(vc_nodes.get(t, 0)) for t in tenants}
    if basis == "gpu-hours":
        hours: dict[str, float] = {t: 0.0 for t in tenants}
        for job in workload.jobs:
            hours[job.tenant] += job.gpus * job.duration_s / 3600.0
        return hours
    raise ValueError(f"unknown quota basis {basis!r}; use nodes or gpu-hours")
