"""One ``simulate-queue`` experiment: the workload, its tenancy, and a run per policy."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpusched_core.quota import QuotaBook, Tenancy, gpus_to_units, parse_tenancy

from .cluster import FLAVOR
from .engine import Progress, SimConfig, simulate
from .metrics import summarise
from .policies import Policy
from .trace import TraceJob, Workload, apportion

COHORT = "philly"


@dataclass(frozen=True)
class QuotaSetup:
    nominal_gpus: Mapping[str, int]
    borrowing_limit_gpus: int | None


def tenancy_for(setup: QuotaSetup, half_life_s: float) -> Tenancy:
    """One cohort (the cluster) whose teams are the trace's virtual clusters."""
    teams = [{"name": tenant,
              "quota": {FLAVOR: {"nominal": gpus, "borrowing_limit": setup.borrowing_limit_gpus}}}
             for tenant, gpus in sorted(setup.nominal_gpus.items())]
    doc = {"version": 1, "priority_classes": {"batch": 0}, "fair_share": {"half_life_s": half_life_s},
           "tenants": [{"name": COHORT, "children": teams}]}
    return parse_tenancy(doc)


def quota_setup(weights: Mapping[str, float], cluster_gpus: int, borrow_pct: float | None) -> QuotaSetup:
    nominal = apportion(cluster_gpus, weights)
    limit = None if borrow_pct is None else int(round(cluster_gpus * borrow_pct / 100.0))
    return QuotaSetup(nominal, limit)


def schedulable(jobs: Sequence[TraceJob], tenancy: Tenancy, cluster_gpus: int) -> tuple[list[TraceJob], int]:
    """Jobs that could ever run (fit the cluster and their tenant's most-ever quota); and how many not."""
    book = QuotaBook.from_usage(tenancy, {})
    keep = [j for j in jobs if j.gpus <= cluster_gpus and gpus_to_units(j.gpus) <= book.most_ever(j.tenant, FLAVOR)]
    return keep, len(jobs) - len(keep)


def run_policy(workload: Workload, setup: QuotaSetup, policy: Policy, config: SimConfig,
               progress: Progress | None = None) -> tuple[dict, int]:
    """Metrics of one policy (see ``metrics``) and the number of jobs left out as unschedulable."""
    tenancy = tenancy_for(setup, policy.half_life_s)
    jobs, dropped = schedulable(workload.jobs, tenancy, config.nodes * config.gpus_per_node)
    started = time.perf_counter()
    state = simulate(jobs, tenancy, policy, config, progress)
    wall = time.perf_counter() - started
    metrics = summarise(state, workload.window_s, {t: float(g) for t, g in setup.nominal_gpus.items()}, wall)
    metrics["_preemptions"] = state.preemptions
    return metrics, dropped


def run_all(workload: Workload, setup: QuotaSetup, policies: Sequence[Policy], config: SimConfig,
            log: Callable[[str], None]) -> dict[str, dict]:
    results = {}
    for policy in policies:
        last = [time.perf_counter()]

        def progress(now: float, done: int, pending: int, name: str = policy.name, last: list = last) -> None:
            if time.perf_counter() - last[0] >= 2.0:  # a line every two seconds of wall time at most
                last[0] = time.perf_counter()
                log(f"  {name}: virtual day {now / 86400:.0f}, {done} jobs done, {pending} pending")

        log(f"simulating {policy.name} ...")
        metrics, dropped = run_policy(workload, setup, policy, config, progress)
        if dropped:
            log(f"  {policy.name}: {dropped} job(s) can never fit quota or cluster; left out")
        log(f"  {policy.name}: done in {metrics['wall_s']:.1f} s")
        results[policy.name] = metrics
    return results
