"""What a what-if run reports, per policy (or tenancy): waits per tenant (average, p99), JCT, GPU
allocation (the time-weighted mean share of GPUs allocated), fragmentation (time-weighted mean % of GPU
capacity that the workload's requests could not use), preemptions and the GPU-hours of work they threw away,
quota overshoot. (The CLI's table of them: ``gpusched_simulation.whatif.report.table``.)"""

from __future__ import annotations

import math
from collections.abc import Sequence

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
                           "unschedulable": sum(1 for o in mine if o.unschedulable is not None),
                           "preempted": sum(o.preempted for o in mine),
                           "lost_gpu_hours": sum(o.lost_gpu_s for o in mine) / 3600}
    return {
        "jobs": len(outcomes), "replayed": len(ran),
        "unschedulable": [{"job_id": o.job.job_id, "tenant": o.job.tenant, "reason": o.unschedulable}
                          for o in outcomes if o.unschedulable is not None],
        "avg_wait_s": _mean([o.wait_s for o in ran]), "p99_wait_s": percentile([o.wait_s for o in ran], 99),
        "avg_jct_s": _mean([o.end_s - o.job.submit_s for o in ran]),
        "gpu_allocation_pct": 100 * state.allocated_gpu_s / (state.cluster.capacity * span) if span > 0 else 0.0,
        "fragmentation_pct": state.fragmented_pct_s / span if span > 0 and state.workload is not None else None,
        "preemptions": state.preemptions,
        "lost_gpu_hours": state.lost_gpu_s / 3600,
        "max_quota_overshoot_gpus": max(0, state.max_overshoot_units) / UNITS_PER_GPU,
        "tenants": tenants,
    }

