"""What each tenant held of each GPU model at one sampling instant, and how busy it was (pure): the rows the
metrics service writes to ``usage_samples`` on its sampling cycle.

An allocation counts as its share of the GPU: ``milli / 1000`` (a whole GPU 1, a share its milli, a MIG
instance its share of the memory slices, as placement charges it). It is *busy* when its GPU's latest
reading is fresh and above the busy threshold; ``mean_utilization_pct`` is the share-weighted mean
utilisation of the tenant's GPUs of that model that have a fresh reading (None: none has).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpusched_core.metrics.views import GpuReading
from gpusched_core.placement.model import MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class ShareRow:
    """One allocation: the GPU, the job's tenant (None: no jobs row, it is left out) and its milli."""

    node_id: str
    gpu_index: int
    job_id: str
    tenant: str | None
    milli: int


@dataclass(frozen=True, slots=True)
class UsageSample:
    sampled_at: datetime
    tenant: str
    gpu_model: str
    allocated_gpus: float
    busy_gpus: float
    mean_utilization_pct: float | None


def plan_usage_samples(shares: Iterable[ShareRow], models: Mapping[tuple[str, int], str],
                       activity: Mapping[tuple[str, int], GpuReading], now: datetime, *, busy_pct: float,
                       max_sample_age: timedelta) -> tuple[UsageSample, ...]:
    """One sample per (tenant, model) holding anything at ``now``, sorted by both. ``models``: the model of
    each GPU (an allocation on a GPU the inventory no longer lists is left out)."""
    acc: dict[tuple[str, str], list[float]] = {}  # allocated, busy, share-weighted util, reporting share
    for s in shares:
        model = models.get((s.node_id, s.gpu_index))
        if s.tenant is None or model is None:
            continue
        share = min(s.milli, MILLI_PER_GPU) / MILLI_PER_GPU
        a = acc.setdefault((s.tenant, model), [0.0, 0.0, 0.0, 0.0])
        a[0] += share
        reading = activity.get((s.node_id, s.gpu_index))
        if reading is not None and now - reading.sampled_at <= max_sample_age:
            a[1] += share if reading.utilization_pct > busy_pct else 0.0
            a[2] += share * reading.utilization_pct
            a[3] += share
    return tuple(UsageSample(now, tenant, model, round(a[0], 6), round(a[1], 6),
                             round(a[2] / a[3], 4) if a[3] else None)
                 for (tenant, model), a in sorted(acc.items()))
