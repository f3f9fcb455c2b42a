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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
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
    return TRACES / "philly-pollux" / "philly.csv"


def default_vc_path() -> Path:
    return TRACES / "helios" / "philly_vc.csv"


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


def apportion(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` whole units in proportion to ``weights`` (largest remainder; ties by name)."""
    positive = {k: w for k, w in weights.items() if w > 0}
    mass = sum(positive.values())
    if not positive or mass <= 0:
        return {k: 0 for k in weights}
    exact = {k: total * w / mass for k, w in positive.items()}
    out = {k: int(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: (-(exact[k] - out[k]), k))[:left]:
        out[k] += 1
    return {k: out.get(k, 0) for k in weights}


def quota_weights(workload: Workload, basis: str, vc_nodes: Mapping[str, int]) -> dict[str, float]:
    """Per tenant of the workload: its node count (``nodes``; 0 for a VC not in the table) or its
    GPU-hours in the window (``gpu-hours``)."""
    tenants = sorted({job.tenant for job in workload.jobs})
    if basis == "nodes":
        return {t: float(vc_nodes.get(t, 0)) for t in tenants}
    if basis == "gpu-hours":
        hours: dict[str, float] = {t: 0.0 for t in tenants}
        for job in workload.jobs:
            hours[job.tenant] += job.gpus * job.duration_s / 3600.0
        return hours
    raise ValueError(f"unknown quota basis {basis!r}; use nodes or gpu-hours")
