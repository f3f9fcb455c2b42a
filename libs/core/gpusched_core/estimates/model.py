"""The values the start-time estimator reads and answers (plain, immutable; no I/O)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpusched_core.placement.mig import parse_mig_profile
from gpusched_core.placement.model import MILLI_PER_GPU
from gpusched_core.quota.units import GpuAsk

DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """A node that takes work: its GPU model and the indices of its healthy GPUs."""

    node_id: str
    model: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Shape:
    """What a job asks for: ``gpus`` whole GPUs on each of ``nodes`` nodes, or a ``share_milli`` of one GPU,
    or one ``mig_profile`` slice; of ``model`` (None: any)."""

    gpus: int = 1
    nodes: int = 1
    model: str | None = None
    share_milli: int | None = None
    mig_profile: str | None = None

    @property
    def fraction_milli(self) -> int | None:
        """The part of one GPU a share or a MIG slice takes (a slice as its compute slices of 7)."""
        if self.share_milli is not None:
            return self.share_milli
        if self.mig_profile is not None:
            return math.ceil(parse_mig_profile(self.mig_profile)[0] * MILLI_PER_GPU / 7)
        return None

    @property
    def total_gpus(self) -> float:
        fraction = self.fraction_milli
        return fraction / MILLI_PER_GPU if fraction is not None else float(self.gpus * self.nodes)

    def ask(self, model: str | None = None) -> GpuAsk:
        models = (model,) if model else ((self.model,) if self.model else ())
        if self.share_milli is not None:
            return GpuAsk(share_milli=self.share_milli, models=models)
        if self.mig_profile is not None:
            return GpuAsk(mig_profile=self.mig_profile, models=models)
        return GpuAsk(gpus=self.gpus * self.nodes, models=models)

    def history_key(self) -> tuple[float, str | None]:
        """Runs of the same shape: the same GPUs in all and the same model asked for."""
        return (self.total_gpus, self.model)


@dataclass(frozen=True, slots=True)
class Hold:
    """What a running job holds of one GPU: ``milli`` of GPU ``gpu_index`` of ``node_id``."""

    node_id: str
    gpu_index: int
    milli: int = MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs since ``started_at_s`` (its run-time is estimated like a waiting job's)."""

    job_id: str
    tenant: str
    shape: Shape
    started_at_s: float
    holds: tuple[Hold, ...]
    time_limit_s: float | None = None


@dataclass(frozen=True, slots=True)
class WaitingJob:
    """A waiting job, given in queue order. ``reserved_model``: it holds quota for that model already and
    waits for GPUs (placement's queue); None: it waits for quota (a quota cohort's queue)."""

    job_id: str
    tenant: str
    shape: Shape
    submitted_at_s: float
    priority: int = 0
    position: int | None = None
    time_limit_s: float | None = None
    reserved_model: str | None = None


@dataclass(frozen=True, slots=True)
class FinishedRun:
    """A past run: its tenant, shape key (``Shape.history_key``), how long it ran and when it ended."""

    tenant: str
    total_gpus: float
    model: str | None
    runtime_s: float
    finished_at_s: float


@dataclass(frozen=True, slots=True)
class EstimateConfig:
    """``history_s``: how far back finished runs count; ``min_runs``: the fewest runs a median is taken of;
    ``default_runtime_s``: the run-time with neither a limit nor enough runs; ``overdue_s``: what an overdue
    run is still given; ``horizon_s``: estimates beyond this are ``unknown``; ``statistic``: ``median`` or
    ``mean`` of the past runs (run-times are heavy-tailed: the mean is the better guess of when a queue of
    many jobs drains, see /work/notes/estimates.md)."""

    history_s: float = 14 * DAY_S
    min_runs: int = 3
    default_runtime_s: float = 3600.0
    overdue_s: float = 60.0
    horizon_s: float = 30 * DAY_S
    statistic: str = "median"


@dataclass(frozen=True, slots=True)
class RuntimeEstimate:
    seconds: float
    source: str  # "time limit", "tenant median of 37 runs", "median of 12 runs of all tenants", "default"


@dataclass(frozen=True, slots=True)
class Estimate:
    """Of one waiting job: when it should start (None: unknown or never, see ``reason``), how long after
    ``now`` that is, and the run-time estimate it was given. ``reason`` names no other job (a reader may
    see a job's estimate but not every job it waits behind)."""

    job_id: str
    position: int | None
    start_s: float | None
    wait_s: float | None
    runtime_s: float
    runtime_source: str
    reason: str
    after_job: str | None = None  # the run whose end lets it start (another tenant's, perhaps)
