"""Placement's pure value types: pending jobs and what a cycle decides for them. The decisions
themselves come from the placement engine (`placement.engine`), driven by `placement.cycle`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

_NEVER = datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    gpus: int
    gpu_model: str | None
    priority: int
    seq: int  # arrival at placement
    submitted_at: datetime | None = None


@dataclass(frozen=True)
class Placement:
    job_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_model: str
    reason: str


@dataclass(frozen=True)
class Deferral:
    job_id: str
    reasons: tuple[str, ...]


def order_pending(pending: list[PendingJob]) -> list[PendingJob]:
    """Higher priority first, then submission time (jobs without one last), then arrival, then job id."""
    return sorted(pending, key=lambda j: (-j.priority, j.submitted_at is None, j.submitted_at or _NEVER, j.seq,
                                          j.job_id))
