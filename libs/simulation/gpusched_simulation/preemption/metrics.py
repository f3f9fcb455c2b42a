"""What a replay reports: high-priority waits, GPU time lost to preemption, preemptions, utilization.

- ``hp_wait_*``: seconds from creation to first start, over high-priority pods (LS, Guaranteed),
  percentiles by linear interpolation; a preemptor starts when its victims' grace ends.
- ``gpu_hours_lost_pct``: GPU-hours of preempted runs not saved by a checkpoint (restore included),
  as a % of the GPU-hours of work in the replayed trace.
- ``preemptions_per_hp_job``: preempted runs per high-priority pod.
- ``gpu_utilization_pct``: allocated GPU time as a % of capacity over the arrival window, from the
  arrival of the 1st-percentile pod to the last arrival (openb's first 115 days hold under 1% of its
  pods; counting them would only measure an idle cluster).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched_common.table import render

from .state import SimState
from .workload import SimPod

JSON_KEYS = ("preemption", "hp_wait_p50_s", "hp_wait_p99_s", "gpu_hours_lost_pct", "preemptions_per_hp_job",
             "gpu_utilization_pct")  # fmt: skip


def arrival_window(pods: Sequence[SimPod]) -> tuple[float, float]:
    """(arrival of the 1st-percentile pod, last arrival); ``pods`` sorted by creation time."""
    if not pods:
        return 0.0, 0.0
    first = pods[int(0.01 * (len(pods) - 1))].created_s
    return first, max(first + 1.0, pods[-1].created_s)


@dataclass(frozen=True)
class RunMetrics:
    preemption: bool
    hp_wait_p50_s: float
    hp_wait_p99_s: float
    gpu_hours_lost_pct: float
    preemptions_per_hp_job: float
    gpu_utilization_pct: float
    hp_pods: int
    preemptions: int
    lost_gpu_hours: float
    hp_wait_max_s: float
    wall_s: float

    def as_json(self) -> dict[str, float | bool]:
        return {key: getattr(self, key) for key in JSON_KEYS}


def measure(state: SimState, pods: Sequence[SimPod], capacity_milli: int, wall_s: float) -> RunMetrics:
    starts = [(state.records[p.pod_id].first_start_s, p.created_s) for p in pods if p.high]
    waits = np.array([start - created for start, created in starts if start is not None], dtype=float)
    work_gpu_s = sum(p.work_s * p.gpu_milli / 1000.0 for p in pods)
    low, high = state.window
    utilization = 100.0 * state.busy_milli_s / (capacity_milli * (high - low)) if capacity_milli else 0.0
    hp = int(waits.size)
    return RunMetrics(
        preemption=state.config.preemption,
        hp_wait_p50_s=round(float(np.percentile(waits, 50)) if hp else 0.0, 1),
        hp_wait_p99_s=round(float(np.percentile(waits, 99)) if hp else 0.0, 1),
        gpu_hours_lost_pct=round(100.0 * state.lost_gpu_s / work_gpu_s if work_gpu_s else 0.0, 3),
        preemptions_per_hp_job=round(state.preemptions / hp if hp else 0.0, 4),
        gpu_utilization_pct=round(utilization, 2),
        hp_pods=hp,
        preemptions=state.preemptions,
        lost_gpu_hours=round(state.lost_gpu_s / 3600.0, 2),
        hp_wait_max_s=round(float(waits.max()) if hp else 0.0, 1),
        wall_s=round(wall_s, 1),
    )


HEADERS = ("preemption", "HP wait p50 s", "HP wait p99 s", "HP wait max s", "GPU-h lost %", "preempt/HP job",
           "preemptions", "GPU util %", "wall s")  # fmt: skip


def table(runs: Sequence[RunMetrics]) -> str:
    rows = [("on" if run.preemption else "off", f"{run.hp_wait_p50_s:.1f}", f"{run.hp_wait_p99_s:.1f}",
             f"{run.hp_wait_max_s:.1f}", f"{run.gpu_hours_lost_pct:.3f}", f"{run.preemptions_per_hp_job:.4f}",
             run.preemptions, f"{run.gpu_utilization_pct:.2f}", f"{run.wall_s:.1f}") for run in runs]  # fmt: skip
    return render(HEADERS, rows)


def comparison(runs: Sequence[RunMetrics]) -> list[str]:
    """The goal check: p99 cut >= 5x while losing < 2% of GPU-hours."""
    off = next((r for r in runs if not r.preemption), None)
    on = next((r for r in runs if r.preemption), None)
    if off is None or on is None:
        return []
    if off.hp_wait_p99_s == 0:
        return [f"no high-priority p99 wait to cut (0 s without preemption); {on.gpu_hours_lost_pct:.3f}% of "
                "GPU-hours lost with it"]
    ratio = off.hp_wait_p99_s / on.hp_wait_p99_s if on.hp_wait_p99_s > 0 else float("inf")
    met = ratio >= 5.0 and on.gpu_hours_lost_pct < 2.0
    return [f"HP p99 wait cut {ratio:.1f}x ({off.hp_wait_p99_s:.0f} s -> {on.hp_wait_p99_s:.0f} s), "
            f"{on.gpu_hours_lost_pct:.3f}% of GPU-hours lost: goal (>= 5x, < 2%) {'met' if met else 'NOT met'}"]
