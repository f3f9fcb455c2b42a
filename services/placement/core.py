"""Placement's pure value types: pending jobs and what a cycle decides for them. The decisions
themselves come from the placement engine (`placement.engine`), driven by `placement.cycle`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from gpusched_common.events import JobSpec

_NEVER = datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class PendingJob:
    """A job waiting for placement: ``gpus`` whole GPUs on each of ``nodes`` nodes (a gang when > 1), or a
    share of one GPU (``share_milli`` and ``share_memory_mib``), or one MIG slice of ``mig_profile``."""

    job_id: str
    gpus: int
    gpu_model: str | None
    priority: int
    seq: int  # arrival at placement
    submitted_at: datetime | None = None
    nodes: int = 1
    share_milli: int | None = None
    share_memory_mib: int = 0
    mig_profile: str | None = None
    cpu_milli: int = 0  # host CPU and memory on each node
    memory_mib: int = 0


def pending_from_spec(job_id: str, spec: JobSpec, seq: int = 0, submitted_at: datetime | None = None) -> PendingJob:
    share = spec.gpu_share
    return PendingJob(job_id, spec.gpus, spec.gpu_model, spec.priority, seq, submitted_at, spec.nodes,
                      share.milli if share else None, share.memory_mib if share else 0, spec.mig_profile,
                      spec.cpu_milli, spec.memory_mib)


@dataclass(frozen=True)
class Member:
    """One node of a placement: the GPUs it got there."""

    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    """Where a job goes. ``node_id``/``gpu_indices``/``gpu_uuids`` are its first (for a gang: rank 0)
    member; ``members`` lists every node of a gang (empty for a single node). A share or a MIG slice
    says what part of the GPU it got. ``cpu_milli`` / ``memory_mib``: host resources held on each node."""

    job_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_model: str
    reason: str
    members: tuple[Member, ...] = ()
    share_milli: int | None = None
    share_memory_mib: int | None = None
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_memory_slices: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def all_members(self) -> tuple[Member, ...]:
        return self.members or (Member(self.node_id, self.gpu_indices, self.gpu_uuids),)


@dataclass(frozen=True)
class Deferral:
    job_id: str
    reasons: tuple[str, ...]


def order_pending(pending: list[PendingJob]) -> list[PendingJob]:
    """Higher priority first, then submission time (jobs without one last), then arrival, then job id."""
    return sorted(pending, key=lambda j: (-j.priority, j.submitted_at is None, j.submitted_at or _NEVER, j.seq,
                                          j.job_id))
