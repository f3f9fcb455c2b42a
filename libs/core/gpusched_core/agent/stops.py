"""When a node agent stops a running job, and what it says about it (pure).

- `decide_preempt`: a `PreemptJob` stops a job that runs here and is not stopping already; its grace is
  what is left until the deadline (never negative).
- `decide_gpu_fault`: when a GPU turns unhealthy, the jobs on it are stopped (policy `stop`) or kept
  (any other policy, i.e. `keep`); the health report lists the GPU's jobs and what was done to them.
- `stop_error`: the error an exit caused by the agent carries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpusched_common.events import ExitReason

from gpusched_core.durations import format_duration
from .start import Ignore

# why a PreemptJob is ignored
NOT_HERE = "not_started_here"  # placement hears the job's exit (or that it is missing) anyway
ALREADY_ENDED = "already_ended"  # ended and reported: placement has the exit
ALREADY_STOPPING = "already_stopping"  # a redelivered PreemptJob, or a stop for another reason under way

# what a GPU fault does to the jobs on the GPU (GpuHealthChanged.job_action)
JOBS_STOPPED, JOBS_KEPT = "stopped", "kept"
STOP_POLICY = "stop"


@dataclass(frozen=True)
class Preempt:
    grace_s: float  # SIGTERM now, SIGKILL after this


@dataclass(frozen=True)
class FaultResponse:
    job_ids: tuple[str, ...]  # the jobs on the GPU, in job id order
    job_action: str | None  # JOBS_STOPPED, JOBS_KEPT, or None (the GPU is healthy, or runs no job)

    @property
    def to_stop(self) -> tuple[str, ...]:
        return self.job_ids if self.job_action == JOBS_STOPPED else ()


def decide_preempt(*, known: bool, reported: bool, stopping: bool, deadline_at: datetime,
                   now: datetime) -> Preempt | Ignore:
    if not known:
        return Ignore(NOT_HERE)
    if reported:
        return Ignore(ALREADY_ENDED)
    if stopping:
        return Ignore(ALREADY_STOPPING)
    return Preempt(max(0.0, (deadline_at - now).total_seconds()))


def decide_gpu_fault(*, gpu_index: int, healthy: bool, job_gpus: Mapping[str, Sequence[int]],
                     policy: str) -> FaultResponse:
    """`job_gpus`: each running job's GPU indices."""
    jobs = tuple(sorted(job_id for job_id, gpus in job_gpus.items() if gpu_index in gpus))
    if not jobs or healthy:
        return FaultResponse(jobs, None)
    return FaultResponse(jobs, JOBS_STOPPED if policy == STOP_POLICY else JOBS_KEPT)


def stop_error(reason_code: str | None, *, node_id: str, gpu_indices: Sequence[int], lease_epoch: int,
               unhealthy_reasons: Mapping[int, Sequence[str]], time_limit_s: float | None = None) -> str | None:
    """The error of an exit the agent caused: which GPUs failed and why (`unhealthy_reasons`: the reasons
    of each unhealthy GPU of the node), or which lease expired; None for other stops."""
    if reason_code == ExitReason.GPU_UNHEALTHY:
        sick = [f"GPU {i}: {'; '.join(unhealthy_reasons[i])}" for i in gpu_indices if i in unhealthy_reasons]
        return f"stopped by {node_id}: {', '.join(sick) or 'GPU unhealthy'}"
    if reason_code == ExitReason.LEASE_LOST:
        return f"stopped by {node_id}: node lease (epoch {lease_epoch}) expired"
    if reason_code == ExitReason.TIME_LIMIT:
        return f"time limit {format_duration(time_limit_s or 0)} reached"
    return None

