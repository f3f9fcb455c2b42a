"""One what-if experiment: the same history replayed once per placement policy and tenancy. The caller
gives the clock that times each run (``clock``: e.g. ``time.perf_counter``; None: ``wall_s`` is left out)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpusched_core.placement import policy_names
from gpusched_core.quota import Tenancy

from .cluster import ReplayNode
from .engine import ReplayJob, replay
from .preempt import PreemptionSettings
from .report import summarise


def run_all(jobs: Sequence[ReplayJob], nodes: Sequence[ReplayNode], policies: Sequence[str],
            tenancies: Mapping[str, Tenancy | None], log: Callable[[str], None] = lambda line: None, *,
            clock: Callable[[], float] | None = None, preemption: PreemptionSettings = PreemptionSettings(),
            stop: Callable[[], bool] | None = None) -> dict[str, dict]:
    """``{run name: figures}``; a run is named by its policy, and its tenancy file when there are several
    or one was given (``policy@file``)."""
    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(policy_names())}")
    results = {}
    for label, tenancy in tenancies.items():
        for policy in policies:
            name = policy if not label else f"{policy}@{label}"
            began = clock() if clock is not None else None
            figures = summarise(replay(jobs, nodes, policy, tenancy, preemption=preemption, stop=stop))
            figures |= {"policy": policy, "tenancy": label or None}
            took = ""
            if clock is not None and began is not None:
                figures["wall_s"] = clock() - began
                took = f" ({figures['wall_s']:.1f} s)"
            log(f"  {name}: {figures['replayed']} of {figures['jobs']} jobs replayed, "
                f"{len(figures['unschedulable'])} unschedulable, {figures['preemptions']} preemptions{took}")
            results[name] = figures
    return results
