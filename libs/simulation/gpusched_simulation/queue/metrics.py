"""Metrics of one replay.

- ``avg_jct_s`` / ``p99_jct_s``: completion minus submission, over completed jobs.
- ``avg_wait_s`` / ``p99_wait_s``: JCT minus the job's trace duration (all time not spent making
  progress: queueing before the first start, after each preemption, and checkpoint restores).
- ``makespan_s``: from the window start to the last completion.
- ``gpu_utilization_pct``: busy GPU-seconds inside the replayed window / (GPUs x window length).
- ``jain_fairness``: per 60-minute window of the replayed span, each tenant with work present gets an
  entitlement: the window's GPU-seconds shared in proportion to nominal quota (at least one GPU's
  worth) and capped by the tenant's demand (GPU-seconds of its jobs present, running or waiting),
  water-filled. ``x = received / entitlement``; Jain's index ``(sum x)^2 / (n sum x^2)``; averaged
  over the windows with at least one such tenant.
- ``max_quota_overshoot_gpus``: the largest amount by which any tenant's reserved GPUs exceeded
  nominal + borrowing limit, or the cohort's reserved GPUs exceeded its quota, at any instant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from gpusched_core.quota import units_to_gpus

from .state import SimState

WINDOW_S = 3600.0


def summarise(state: SimState, window_s: float, nominal_gpus: Mapping[str, float], wall_s: float) -> dict:
    done = [s for s in state.jobs.values() if s.completed_s is not None]
    jct = np.array([s.completed_s - s.job.arrival_s for s in done]) if done else np.zeros(1)
    wait = np.array([s.completed_s - s.job.arrival_s - s.job.duration_s for s in done]) if done else np.zeros(1)
    capacity = state.cluster.capacity
    busy = sum(g * max(0.0, min(end, window_s) - start) for _, start, end, g in state.runs if start < window_s)
    return {
        "avg_jct_s": round(float(jct.mean()), 1),
        "p99_jct_s": round(float(np.percentile(jct, 99)), 1),
        "avg_wait_s": round(float(wait.mean()), 1),
        "p99_wait_s": round(float(np.percentile(wait, 99)), 1),
        "makespan_s": round(max((s.completed_s for s in done), default=0.0), 1),
        "gpu_utilization_pct": round(100.0 * busy / (capacity * window_s), 2),
        "jain_fairness": round(jain_fairness(state, window_s, nominal_gpus), 4),
        "max_quota_overshoot_gpus": units_to_gpus(max(0, state.max_overshoot_units)),
        "jobs": len(done),
        "wall_s": round(wall_s, 2),
    }


def per_window(intervals: Iterable[tuple[float, float, float]], windows: int, width_s: float) -> np.ndarray:
    """GPU-seconds per window of ``(start, end, gpus)`` intervals (exact, by integrating the rate)."""
    edges = np.arange(windows + 1) * width_s
    items = [(a, b, g) for a, b, g in intervals if b > a]
    if not items:
        return np.zeros(windows)
    starts, ends, gpus = (np.array(col, dtype=float) for col in zip(*items))
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([gpus, -gpus])
    order = np.argsort(times, kind="stable")
    times, rate = times[order], np.cumsum(deltas[order])
    area = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(times))])  # integral up to each time
    at_edges = np.interp(edges, times, area, left=0.0, right=area[-1])
    return np.diff(at_edges)


def water_fill(capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity`` capped by demand."""
    share = {t: 0.0 for t in demand}
    active = {t for t, d in demand.items() if d > 0}
    left = capacity
    while active and left > 1e-9:
        mass = sum(weight[t] for t in active)
        offer = {t: left * weight[t] / mass for t in active}
        capped = {t for t in active if demand[t] - share[t] <= offer[t]}
        if not capped:
            for t in active:
                share[t] += offer[t]
            break
        for t in capped:
            left -= demand[t] - share[t]
            share[t] = demand[t]
        active -= capped
    return share


def jain(values: Iterable[float]) -> float:
    xs = np.array(list(values), dtype=float)
    if xs.size == 0 or not np.any(xs):
        return 1.0 if xs.size else float("nan")
    return float(xs.sum() ** 2 / (xs.size * (xs ** 2).sum()))


def jain_fairness(state: SimState, window_s: float, nominal_gpus: Mapping[str, float]) -> float:
    windows = max(1, int(np.ceil(window_s / WINDOW_S)))
    tenants = sorted({s.job.tenant for s in state.jobs.values()})
    received = {t: per_window(((a, b, g) for tt, a, b, g in state.runs if tt == t), windows, WINDOW_S)
                for t in tenants}
    demand = {t: per_window(((s.job.arrival_s, s.completed_s if s.completed_s is not None else window_s,
                              s.job.gpus) for s in state.jobs.values() if s.job.tenant == t), windows, WINDOW_S)
              for t in tenants}
    weight = {t: max(nominal_gpus.get(t, 0.0), 1.0) for t in tenants}
    scores = []
    for w in range(windows):
        entitled = water_fill(state.cluster.capacity * WINDOW_S, {t: demand[t][w] for t in tenants}, weight)
        xs = [received[t][w] / entitled[t] for t in tenants if entitled[t] > 1e-6]
        if xs:
            scores.append(jain(xs))
    return float(np.mean(scores)) if scores else 1.0
