"""Run results as the JSON document of issue 3 and as a table for people."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpusched_common.table import render
from gpusched_core.placement import PolicyInfo

from .metrics import unallocated_pct
from .published import published_unallocated
from .replay import RunLog


@dataclass(frozen=True, slots=True)
class RunResult:
    log: RunLog
    wall_s: float

    def as_json(self) -> dict[str, object]:
        log = self.log
        return {
            "policy": log.policy,
            "seed": log.seed,
            "unallocated_gpu_pct": unallocated_pct(log.arrived_milli, log.allocated_milli, log.capacity_milli),
            "fragmentation_pct": {str(k): round(v, 2) for k, v in sorted(log.fragmentation_pct.items())},
            "placed": log.placed,
            "failed": log.failed,
            "wall_s": round(self.wall_s, 2),
        }


def _median_at_100(results: Sequence[RunResult]) -> float | None:
    values = [r.as_json()["unallocated_gpu_pct"].get("100") for r in results]  # type: ignore[union-attr]
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def summarise(results: Sequence[RunResult], infos: dict[str, PolicyInfo], workload: str,
              published_dir: Path) -> tuple[list[dict[str, object]], str | None]:  # fmt: skip
    """Per-policy summary rows and the best of our own policies (lowest median at 100%)."""
    summary: list[dict[str, object]] = []
    best_own: tuple[float, str] | None = None
    for policy in dict.fromkeys(r.log.policy for r in results):
        runs = [r for r in results if r.log.policy == policy]
        median = _median_at_100(runs)
        info = infos.get(policy)
        figure = None
        if info is not None and info.published_as:
            figure = published_unallocated(published_dir, workload, info.published_as)
        summary.append({
            "policy": policy,
            "median_unallocated_gpu_pct_at_100": median,
            "published_median_at_100": figure.median if figure else None,
            "published_seed_range_at_100": [figure.low, figure.high] if figure else None,
        })  # fmt: skip
        if info is not None and info.own and median is not None and (best_own is None or median < best_own[0]):
            best_own = (median, policy)
    return summary, best_own[1] if best_own else None


def document(trace: str, nodes: str, results: Sequence[RunResult], summary: list[dict[str, object]],
             best_own: str | None) -> dict[str, object]:  # fmt: skip
    return {
        "trace": trace,
        "nodes": nodes,
        "results": [r.as_json() for r in results],
        "summary": summary,
        "best_own_policy": best_own,
    }


HEADERS = ("policy", "seeds", "unalloc@100 median", "min-max", "published", "published range", "in range",
           "wall s")  # fmt: skip


def table(results: Sequence[RunResult], summary: list[dict[str, object]]) -> str:
    """One line per policy: the median at 100% arrived over its seeds, beside the published figure."""
    rows = []
    for row in summary:
        runs = [r for r in results if r.log.policy == row["policy"]]
        at_100 = [v for r in runs if (v := r.as_json()["unallocated_gpu_pct"].get("100")) is not None]  # type: ignore[union-attr]
        spread = f"{min(at_100):.2f}-{max(at_100):.2f}" if at_100 else None
        median = row["median_unallocated_gpu_pct_at_100"]
        band = row["published_seed_range_at_100"]
        band_text = f"{band[0]:.2f}-{band[1]:.2f}" if band else None  # type: ignore[index]
        inside = None if not band or median is None else ("yes" if band[0] <= median <= band[1] else "no")  # type: ignore[index,operator]
        wall = f"{sum(r.wall_s for r in runs):.1f}"
        rows.append((row["policy"], len(runs), median, spread, row["published_median_at_100"], band_text, inside, wall))
    return render(HEADERS, rows)
