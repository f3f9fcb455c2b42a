"""The ``simulate-queue`` table and JSON document."""

from __future__ import annotations

from collections.abc import Mapping

from gpusched_common.table import render

from ..report import percent_change

METRIC_KEYS = ("avg_jct_s", "p99_jct_s", "avg_wait_s", "p99_wait_s", "makespan_s", "gpu_utilization_pct",
               "jain_fairness", "max_quota_overshoot_gpus", "jobs", "wall_s")
HEADERS = ("POLICY", "AVG JCT s", "P99 JCT s", "AVG WAIT s", "P99 WAIT s", "MAKESPAN s", "GPU UTIL %",
           "JAIN", "OVERSHOOT GPUs", "JOBS", "PREEMPTIONS", "WALL s")


def document(default_policy: str, results: Mapping[str, Mapping[str, object]]) -> dict:
    """Exactly ``{"default_policy": NAME, "policies": {NAME: {metric: value}}}``."""
    return {"default_policy": default_policy,
            "policies": {name: {key: metrics[key] for key in METRIC_KEYS} for name, metrics in results.items()}}


def table(default_policy: str, results: Mapping[str, Mapping[str, object]]) -> str:
    rows = []
    for name, m in results.items():
        label = f"{name} (default)" if name == default_policy else name
        rows.append((label, f"{m['avg_jct_s']:.0f}", f"{m['p99_jct_s']:.0f}", f"{m['avg_wait_s']:.0f}",
                     f"{m['p99_wait_s']:.0f}", f"{m['makespan_s']:.0f}", f"{m['gpu_utilization_pct']:.2f}",
                     f"{m['jain_fairness']:.4f}", f"{m['max_quota_overshoot_gpus']:g}", m["jobs"],
                     m.get("_preemptions", "-"), f"{m['wall_s']:.2f}"))
    return render(HEADERS, rows)


def comparison(default_policy: str, results: Mapping[str, Mapping[str, float]]) -> list[str]:
    """One line per goal of the issue that the results can speak to."""
    ours = results.get(default_policy)
    lines = []
    if ours is None:
        return lines
    fifo, sjf = results.get("fifo"), results.get("sjf")
    if fifo is not None:
        lines.append(f"{default_policy} vs fifo: avg JCT {percent_change(ours['avg_jct_s'], fifo['avg_jct_s'])}, "
                     f"Jain {ours['jain_fairness']:.4f} vs {fifo['jain_fairness']:.4f}")
    if sjf is not None:
        lines.append(f"{default_policy} vs oracle sjf: avg JCT {percent_change(ours['avg_jct_s'], sjf['avg_jct_s'])} "
                     f"(goal: within +5%, Jain >= 0.95)")
    return lines

