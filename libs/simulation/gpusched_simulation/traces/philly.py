"""The Philly trace as a queueing workload: jobs of a time window, virtual clusters as tenants.

``philly.csv`` (Pollux's copy of Microsoft Philly) has ``timestamp, duration, num_gpus, gpu_time,
cluster``, not sorted, with a blank last line. Its first three weeks hold only a few dozen stragglers
(a literal "first 7 days" window has 9 jobs), so the default window starts at the first calendar day
with at least ``BUSY_DAY_ARRIVALS`` arrivals (2017-09-24); ``--start trace`` takes the very first
timestamp instead, and ``--start 2017-10-01`` any day.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from .location import traces_dir

BUSY_DAY_ARRIVALS = 100


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    tenant: str
    arrival_s: float  # seconds after the window start
    duration_s: float
    gpus: int


@dataclass(frozen=True)
class Workload:
    start: datetime
    window_s: float
    jobs: tuple[TraceJob, ...]  # by arrival, then trace order


def default_trace_path() -> Path:
    return traces_dir() / "philly-pollux" / "philly.csv"


def default_vc_path() -> Path:
    return traces_dir() / "helios" / "philly_vc.csv"


def read_rows(path: Path) -> list[tuple[datetime, float, int, str]]:
    """(submitted, duration_s, gpus, virtual cluster) of every job, in file order."""
    rows = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if not row.get("timestamp"):
                continue
            rows.append((datetime.fromisoformat(row["timestamp"]), float(row["duration"]),
                         int(row["num_gpus"]), row["cluster"]))
    return rows


def busy_start(rows: Iterable[tuple[datetime, float, int, str]], min_arrivals: int = BUSY_DAY_ARRIVALS) -> datetime:
    """Midnight of the first day with at least ``min_arrivals`` arrivals."""
    per_day = Counter(row[0].date() for row in rows)
    for day in sorted(per_day):
        if per_day[day] >= min_arrivals:
            return datetime(day.year, day.month, day.day)
    raise ValueError(f"no day of the trace has {min_arrivals} arrivals")


def resolve_start(rows: Sequence[tuple[datetime, float, int, str]], start: str) -> datetime:
    if start == "auto":
        return busy_start(rows)
    if start == "trace":
        return min(row[0] for row in rows)
    return datetime.fromisoformat(start)


def window(rows: Sequence[tuple[datetime, float, int, str]], start: datetime, days: float,
           max_jobs: int | None = None) -> Workload:
    """Jobs submitted in ``[start, start + days)``, ids in arrival order (``p000001``...)."""
    end = start + timedelta(days=days)
    chosen = sorted((row[0], i) for i, row in enumerate(rows) if start <= row[0] < end)
    if max_jobs is not None:
        chosen = chosen[:max_jobs]
    jobs = tuple(TraceJob(f"p{n:06d}", rows[i][3], (when - start).total_seconds(), max(rows[i][1], 1.0),
                          max(rows[i][2], 1)) for n, (when, i) in enumerate(chosen, start=1))
    return Workload(start, days * 86400.0, jobs)


def read_vc_nodes(path: Path) -> dict[str, int]:
    with path.open(newline="") as handle:
        return {row["vc"]: int(row["node num"]) for row in csv.DictReader(handle)}

