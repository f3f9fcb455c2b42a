"""The FGD authors' released results (``fgd-published-results/analysis_allo_discrete.csv``)."""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

ALLOCATION_FILE = "analysis_allo_discrete.csv"


@dataclass(frozen=True, slots=True)
class PublishedFigure:
    """Unallocated GPU % at an arrived checkpoint over the published seeds."""

    median: float
    low: float
    high: float
    seeds: int


def published_unallocated(results_dir: Path, workload: str, published_policy: str,
                          checkpoint: int = 100) -> PublishedFigure | None:  # fmt: skip
    """Median and min-max of ``100 - allocated %`` for (workload, policy), or None if absent."""
    path = results_dir / ALLOCATION_FILE
    if not path.is_file():
        return None
    values = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] == workload and row["sc_policy"] == published_policy:
                cell = row.get(str(checkpoint)) or ""
                if cell:
                    values.append(round(100.0 - float(cell), 2))
    if not values:
        return None
    return PublishedFigure(round(statistics.median(values), 2), min(values), max(values), len(values))
