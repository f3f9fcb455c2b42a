"""One ``simulate-queue`` experiment: a run per policy over the same workload and quotas."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ..traces.philly import Workload
from .engine import Progress, SimConfig, simulate
from .metrics import summarise
from .policies import Policy
from .quota import QuotaSetup, schedulable, tenancy_for


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
    metrics["_preemption_causes"] = dict(sorted(state.preemption_causes.items()))
    metrics["_restore_gpu_h"] = round(state.restore_gpu_s / 3600.0, 1)
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
        if metrics["_preemptions"]:
            log(f"  {policy.name}: {preemption_line(metrics)}")
        results[policy.name] = metrics
    return results


def preemption_line(metrics: dict) -> str:
    """Preemptions by cause and the GPU-hours resumed runs spent restoring: what preemption cost."""
    causes = ", ".join(f"{cause} {n:,}" for cause, n in metrics["_preemption_causes"].items())
    return f"{metrics['_preemptions']:,} preemptions ({causes}); {metrics['_restore_gpu_h']:,} GPU-h restoring"
