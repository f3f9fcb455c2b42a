"""Quota decisions (pure): which pending jobs of a tenant may reserve GPUs under its cap."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

_NEVER = datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    gpus: int
    priority: int
    seq: int  # arrival at the quota service
    submitted_at: datetime | None = None


@dataclass(frozen=True)
class Ledger:
    tenant: str
    cap_gpus: int
    reserved_gpus: int


@dataclass(frozen=True)
class Reservation:
    job_id: str
    tenant_reserved_gpus: int  # the tenant's usage after this reservation


@dataclass(frozen=True)
class Deferral:
    job_id: str
    reason: str


def order_pending(pending: list[PendingJob]) -> list[PendingJob]:
    """Higher priority first, then submission time (jobs without one last), then arrival, then job id."""
    return sorted(pending, key=lambda j: (-j.priority, j.submitted_at is None, j.submitted_at or _NEVER, j.seq,
                                          j.job_id))


def plan_reservations(ledger: Ledger, pending: list[PendingJob]) -> tuple[list[Reservation], list[Deferral]]:
    """Reserve in order while the cap allows. The first job that does not fit blocks the tenant's later
    jobs (no small job overtakes a large one forever); a job larger than the whole cap never fits and
    does not block."""
    reserved = ledger.reserved_gpus
    reservations: list[Reservation] = []
    deferrals: list[Deferral] = []
    blocked_by: PendingJob | None = None
    for job in order_pending(pending):
        if job.gpus > ledger.cap_gpus:
            deferrals.append(Deferral(job.job_id, (
                f"job needs {job.gpus} GPUs but tenant {ledger.tenant} has a cap of {ledger.cap_gpus} GPUs")))
        elif blocked_by is None and reserved + job.gpus <= ledger.cap_gpus:
            reserved += job.gpus
            reservations.append(Reservation(job.job_id, reserved))
        elif blocked_by is None:
            blocked_by = job
            deferrals.append(Deferral(job.job_id, _at_quota(ledger)))
        else:
            deferrals.append(Deferral(job.job_id, _at_quota(ledger) + "; earlier jobs of the tenant go first"))
    return reservations, deferrals


def _at_quota(ledger: Ledger) -> str:
    # Stable wording (no live counts): an unchanged reason is not recorded again.
    return f"tenant {ledger.tenant} is at its quota of {ledger.cap_gpus} GPUs"
