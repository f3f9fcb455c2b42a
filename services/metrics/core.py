"""Cluster utilization from the latest NVML sample of every GPU (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

BUSY_THRESHOLD_PCT = 5.0


@dataclass(frozen=True)
class GpuReading:
    node_id: str
    index: int
    utilization_pct: float
    sampled_at: datetime


@dataclass(frozen=True)
class ClusterUtilization:
    gpus_reporting: int
    gpus_busy: int
    mean_utilization: float  # 0..1 over reporting GPUs


def summarize(readings: list[GpuReading], now: datetime, max_age: timedelta) -> ClusterUtilization:
    """Mean utilization over GPUs whose latest sample is fresher than `max_age`; busy = above 5%."""
    fresh = [r for r in readings if now - r.sampled_at <= max_age]
    if not fresh:
        return ClusterUtilization(0, 0, 0.0)
    busy = sum(1 for r in fresh if r.utilization_pct > BUSY_THRESHOLD_PCT)
    mean = sum(r.utilization_pct for r in fresh) / len(fresh) / 100.0
    return ClusterUtilization(len(fresh), busy, round(mean, 4))
