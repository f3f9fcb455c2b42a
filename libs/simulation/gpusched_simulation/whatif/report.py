"""What a what-if run reports, per policy (or tenancy): waits per tenant (average, p99), JCT, GPU
allocation (the time-weighted mean share of GPUs allocated), fragmentation (time-weighted mean % of GPU
capacity that the workload's requests could not use), preemptions, quota overshoot; and the table."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from gpusched_common.table import render
from gpusched_core.quota import UNITS_PER_GPU

from .engine import Replay


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(pct / 100 * len(ordered)) - 1)]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarise(state: Replay) -> dict:
    outcomes = list(state.outcomes.values())
    ran = [o for o in outcomes if o.start_s is not None and o.end_s is not None]
    first = min((o.job.submit_s for o in outcomes), default=0.0)
    span = max((o.end_s for o in ran), default=first) - first
    tenants: dict[str, dict] = {}
    for tenant in sorted({o.job.tenant for o in outcomes}):
        mine = [o for o in outcomes if o.job.tenant == tenant]
        waits = [o.wait_s for o in mine if o.wait_s is not None]
        tenants[tenant] = {"jobs": len(mine), "replayed": len(waits), "avg_wait_s": _mean(waits),
                           "p99_wait_s": percentile(waits, 99),
                           "unschedulable": sum(1 for o in mine if o.unschedulable is not None)}
    return {
        "jobs": len(outcomes), "replayed": len(ran),
        "unschedulable": [{"job_id": o.job.job_id, "tenant": o.job.tenant, "reason": o.unschedulable}
                          for o in outcomes if o.unschedulable is not None],
        "avg_wait_s": _mean([o.wait_s for o in ran]), "p99_wait_s": percentile([o.wait_s for o in ran], 99),
        "avg_jct_s": _mean([o.end_s - o.job.submit_s for o in ran]),
        "gpu_allocation_pct": 100 * state.allocated_gpu_s / (state.cluster.capacity * span) if span > 0 else 0.0,
        "fragmentation_pct": state.fragmented_pct_s / span if span > 0 and state.workload is not None else None,
        "preemptions": state.preemptions,
        "max_quota_overshoot_gpus": max(0, state.max_overshoot_units) / UNITS_PER_GPU,
        "tenants": tenants,
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(results: Mapping[str, dict]) -> str:
    """One row per run, then one row per run and tenant."""
    rows = [(name, r["replayed"], len(r["unschedulable"]), _s(r["avg_wait_s"]), _s(r["p99_wait_s"]),
             _s(r["avg_jct_s"]), f"{r['gpu_allocation_pct']:.1f}",
             "-" if r["fragmentation_pct"] is None else f"{r['fragmentation_pct']:.1f}", r["preemptions"],
             f"{r['max_quota_overshoot_gpus']:g}") for name, r in results.items()]
    overall = render(["RUN", "REPLAYED", "UNSCHED.", "AVG WAIT s", "P99 WAIT s", "AVG JCT s", "GPU ALLOC %",
                      "FRAG %", "PREEMPT.", "OVERSHOOT GPUs"], rows)
    per_tenant = render(["RUN", "TENANT", "JOBS", "AVG WAIT s", "P99 WAIT s", "UNSCHED."],
                        [(name, t, f["jobs"], _s(f["avg_wait_s"]), _s(f["p99_wait_s"]), f["unschedulable"])
                         for name, r in results.items() for t, f in r["tenants"].items()])
    return f"{overall}\n\n{per_tenant}"
