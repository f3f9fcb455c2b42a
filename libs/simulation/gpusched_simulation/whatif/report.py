"""The figures of a what-if run are ``gpusched_core.whatif.report`` (re-exported); the table the CLI prints
of them is here: one row per run, then one row per run and tenant."""

from __future__ import annotations

from collections.abc import Mapping

from gpusched_common.table import render
from gpusched_core.whatif.report import percentile, summarise

__all__ = ["percentile", "summarise", "table"]


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(results: Mapping[str, dict]) -> str:
    """One row per run, then one row per run and tenant."""
    rows = [(name, r["replayed"], len(r["unschedulable"]), _s(r["avg_wait_s"]), _s(r["p99_wait_s"]),
             _s(r["avg_jct_s"]), f"{r['gpu_allocation_pct']:.1f}",
             "-" if r["fragmentation_pct"] is None else f"{r['fragmentation_pct']:.1f}", r["preemptions"],
             f"{r.get('lost_gpu_hours', 0.0):.1f}", f"{r['max_quota_overshoot_gpus']:g}")
            for name, r in results.items()]
    overall = render(["RUN", "REPLAYED", "UNSCHED.", "AVG WAIT s", "P99 WAIT s", "AVG JCT s", "GPU ALLOC %",
                      "FRAG %", "PREEMPT.", "LOST GPU-h", "OVERSHOOT GPUs"], rows)
    per_tenant = render(["RUN", "TENANT", "JOBS", "AVG WAIT s", "P99 WAIT s", "UNSCHED.", "PREEMPTED"],
                        [(name, t, f["jobs"], _s(f["avg_wait_s"]), _s(f["p99_wait_s"]), f["unschedulable"],
                          f.get("preempted", 0)) for name, r in results.items() for t, f in r["tenants"].items()])
    return f"{overall}\n\n{per_tenant}"
