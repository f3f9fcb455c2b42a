"""The estimated start of a job not submitted yet (the pre-submission check, ``gpusched submit --check``),
pure: the job is added to the waiting jobs at the place it would take, and the queue's forward simulation
(``forward.plan_estimates``, the one GET /v1/queue/estimates runs) says when it starts. A job quota would
reserve waits for GPUs (placement sorts those by priority and submission itself); a job that waits for quota
goes right after the last job of its cohort's queue that the quota cycle puts ahead of it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpusched_core.quota import Tenancy

from .forward import plan_estimates
from .model import EstimateConfig, Estimate, FinishedRun, NodeGpus, RunningJob, WaitingJob


@dataclass(frozen=True)
class Forward:
    """What the forward simulation reads (``stores.estimates.load_estimate_inputs``), ``waiting`` in queue
    order: placement's queue first (``reserved_model`` set), then the quota queues cohort by cohort."""

    nodes: Sequence[NodeGpus] = ()
    running: Sequence[RunningJob] = ()
    waiting: Sequence[WaitingJob] = ()
    finished: Sequence[FinishedRun] = ()
    config: EstimateConfig = EstimateConfig()


def with_new_job(waiting: Sequence[WaitingJob], job: WaitingJob, ahead: Collection[str]) -> tuple[int, list[WaitingJob]]:
    """The queue with ``job`` where it would wait, and its index there; ``ahead``: the ids the quota cycle
    orders before it (a job that holds quota, ``reserved_model`` set, needs none)."""
    queue = [w for w in waiting if w.job_id != job.job_id]
    first_quota = next((i for i, w in enumerate(queue) if w.reserved_model is None), len(queue))
    if job.reserved_model is not None:
        at = first_quota
    else:
        behind = [i for i, w in enumerate(queue) if w.reserved_model is None and w.job_id in ahead]
        at = behind[-1] + 1 if behind else first_quota
    queue.insert(at, job)
    return at, queue


def estimate_new_job(forward: Forward, job: WaitingJob, ahead: Collection[str], now_s: float,
                     tenancy: Tenancy | None) -> Estimate:
    """When ``job`` would start were it submitted at ``now_s`` (``Estimate.wait_s`` None: never or unknown)."""
    at, queue = with_new_job(forward.waiting, job, ahead)
    return plan_estimates(forward.nodes, forward.running, queue, forward.finished, now_s, tenancy,
                          forward.config)[at]


def wait_words(wait_s: float) -> str:
    """``in under a minute``, ``in ~25 min``, ``in ~3 h``, ``in ~2 d``: an estimate said as roughly as it is known."""
    if wait_s < 60:
        return "in under a minute"
    if wait_s < 90 * 60:
        return f"in ~{max(1, round(wait_s / 60))} min"
    if wait_s < 48 * 3600:
        return f"in ~{round(wait_s / 3600)} h"
    return f"in ~{round(wait_s / 86400)} d"
