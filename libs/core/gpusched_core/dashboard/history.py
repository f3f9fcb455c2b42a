"""Usage history as the dashboard shows it (pure): a window cut into buckets, usage series averaged per
bucket, submit->placed waits summarised, preemptions counted per bucket.

Window (``plan_window``): ``since`` defaults to ``now - 24h``, ``until`` to ``now``; both carry a time zone;
``until > since``. Without ``step_s`` the smallest of ``NICE_STEPS_S`` that makes at most ``TARGET_BUCKETS``
buckets is chosen (beyond a day per bucket: the span / ``TARGET_BUCKETS``, rounded up); more than
``MAX_BUCKETS`` buckets is refused. Bucket ``i`` is ``[since + i*step, since + (i+1)*step)``; the last one may
reach past ``until`` (nothing after ``until`` is loaded).

Usage series: a bucket's value is the mean over the bucket's *sampling instants* (every instant the metrics
service sampled at, whoever held GPUs then), a series without a row at an instant counting 0 there: so a
tenant holding 4 GPUs for half of a bucket averages 2. A bucket with no sampling instant (the metrics
service was down) has no point. ``mean_utilization_pct`` is the allocation-weighted mean of the samples
that have one (None: none has).

Waits: per tenant, the wait of each job placed in the window (placed_at - submitted_at, at least 0), with
percentiles by the **nearest-rank** rule: the p-th percentile of n sorted values is the value at 1-based rank
``ceil(p / 100 * n)`` (so p50 of [1, 2, 3, 4] is 2, and p99 of fewer than 100 values is the largest); and a
histogram whose bins are ``(previous le_s, le_s]`` (the first from 0, the last, ``le_s`` None, unbounded):
bins are not cumulative, their counts sum to ``count``.

Preemptions: per tenant, ``JobPreempted`` events per bucket (only buckets with at least one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from .usage import UsageSample

DEFAULT_SPAN = timedelta(hours=24)
TARGET_BUCKETS = 300
MAX_BUCKETS = 2000
NICE_STEPS_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
WAIT_BINS_S: tuple[int | None, ...] = (1, 10, 60, 300, 1800, 3600, None)
PERCENTILES = (50, 90, 99)


class WindowError(ValueError):
    """A window that cannot be answered (the gateway says 400 with this text)."""


@dataclass(frozen=True, slots=True)
class HistoryWindow:
    since: datetime
    until: datetime
    step_s: int

    @property
    def buckets(self) -> int:
        return math.ceil((self.until - self.since).total_seconds() / self.step_s)

    def bucket_of(self, at: datetime) -> int | None:
        """The bucket ``at`` falls in (None: outside the window)."""
        if at < self.since or at >= self.until:
            return None
        return int((at - self.since).total_seconds() // self.step_s)

    def start_of(self, bucket: int) -> str:
        return (self.since + timedelta(seconds=bucket * self.step_s)).isoformat()


@dataclass(frozen=True, slots=True)
class WaitRow:
    tenant: str | None
    wait_s: float


def plan_window(now: datetime, since: datetime | None = None, until: datetime | None = None,
                step_s: int | None = None) -> HistoryWindow:
    """The window asked for, with its defaults (module docstring); WindowError says what is wrong."""
    for label, at in (("since", since), ("until", until)):
        if at is not None and at.tzinfo is None:
            raise WindowError(f"{label} must carry a time zone (e.g. 2026-12-01T00:00:00Z)")
    until = until if until is not None else now
    since = since if since is not None else until - DEFAULT_SPAN
    span = (until - since).total_seconds()
    if span <= 0:
        raise WindowError(f"until ({until.isoformat()}) must be later than since ({since.isoformat()})")
    if step_s is None:
        step_s = next((s for s in NICE_STEPS_S if span / s <= TARGET_BUCKETS), math.ceil(span / TARGET_BUCKETS))
    if step_s < 1:
        raise WindowError(f"step_s must be at least 1, got {step_s}")
    window = HistoryWindow(since, until, step_s)
    if window.buckets > MAX_BUCKETS:
        raise WindowError(f"{window.buckets} buckets of {step_s}s from {since.isoformat()} to {until.isoformat()}; "
                          f"at most {MAX_BUCKETS}: ask for a larger step_s or a shorter window")
    return window


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest rank: the value at 1-based rank ceil(p/100 * n) of the sorted values (None: no values)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def histogram(values: Iterable[float]) -> list[dict]:
    counts = [0] * len(WAIT_BINS_S)
    for v in values:
        counts[next(i for i, le in enumerate(WAIT_BINS_S) if le is None or v <= le)] += 1
    return [{"le_s": le, "count": n} for le, n in zip(WAIT_BINS_S, counts, strict=True)]


def _series(window: HistoryWindow, rows: list[UsageSample], instants: Iterable[datetime]) -> list[dict]:
    per_bucket: dict[int, set[datetime]] = {}
    for at in [*instants, *(r.sampled_at for r in rows)]:
        bucket = window.bucket_of(at)
        if bucket is not None:
            per_bucket.setdefault(bucket, set()).add(at)
    sums: dict[tuple[str, str], dict[int, list[float]]] = {}  # allocated, busy, util*alloc, alloc with util
    for r in rows:
        bucket = window.bucket_of(r.sampled_at)
        if bucket is None:
            continue
        s = sums.setdefault((r.tenant, r.gpu_model), {}).setdefault(bucket, [0.0, 0.0, 0.0, 0.0])
        s[0] += r.allocated_gpus
        s[1] += r.busy_gpus
        if r.mean_utilization_pct is not None:
            weight = r.allocated_gpus or 1e-9
            s[2] += r.mean_utilization_pct * weight
            s[3] += weight
    out = []
    for (tenant, model), buckets in sorted(sums.items()):
        points = []
        for bucket in sorted(per_bucket):
            n = len(per_bucket[bucket])
            a, b, u, w = buckets.get(bucket, (0.0, 0.0, 0.0, 0.0))
            points.append([window.start_of(bucket), round(a / n, 4), round(b / n, 4), round(u / w, 2) if w else None])
        out.append({"tenant": tenant, "gpu_model": model, "points": points})
    return out


def _waits(rows: Iterable[WaitRow]) -> list[dict]:
    by_tenant: dict[str, list[float]] = {}
    for r in rows:
        by_tenant.setdefault(r.tenant or "", []).append(max(0.0, r.wait_s))
    out = []
    for tenant, values in sorted(by_tenant.items()):
        values.sort()
        out.append({"tenant": tenant or None, "count": len(values),
                    **{f"p{p}_s": round(percentile(values, p) or 0.0, 3) for p in PERCENTILES},
                    "histogram": histogram(values)})
    return out


def _preemptions(window: HistoryWindow, events: Iterable[tuple[str | None, datetime]]) -> list[dict]:
    counts: dict[str, dict[int, int]] = {}
    for tenant, at in events:
        bucket = window.bucket_of(at)
        if bucket is not None:
            per = counts.setdefault(tenant or "", {})
            per[bucket] = per.get(bucket, 0) + 1
    return [{"tenant": tenant or None, "points": [[window.start_of(b), n] for b, n in sorted(per.items())]}
            for tenant, per in sorted(counts.items())]


def plan_history(window: HistoryWindow, tenant: str | None, usage: Iterable[UsageSample], instants: Iterable[datetime],
                 waits: Iterable[WaitRow], preemptions: Iterable[tuple[str | None, datetime]]) -> dict:
    """The /v1/history document for ``window``, narrowed to ``tenant`` by whoever loaded the rows
    (``tenant`` is echoed; None: every tenant's)."""
    return {"tenant": tenant, "since": window.since.isoformat(), "until": window.until.isoformat(),
            "step_s": window.step_s, "buckets": window.buckets,
            "series": _series(window, list(usage), instants), "waits": _waits(waits),
            "preemptions": _preemptions(window, preemptions)}
