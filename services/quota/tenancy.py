"""Pure glue between job specs and the quota policy core: cohorts, database limits, pending jobs."""

from __future__ import annotations

from dataclasses import dataclass

from services.quota.policy import GpuAsk, PendingJob, QuotaBook, Tenancy, UnitError, pending_job


@dataclass(frozen=True)
class QueuedJob:
    """A row of ``quota_policy_pending``: what a job asks for, as its spec says it."""

    job_id: str
    tenant: str
    gpus: int
    gpu_model: str | None
    priority: int
    queued_at_s: float
    last_reason: str | None = None


def cohort_of(tenancy: Tenancy, tenant: str) -> str:
    """The cohort root of a known tenant; an unknown tenant is a cohort of its own (it shares nothing)."""
    return tenancy.root_of(tenant) if tenant in tenancy.tenants else tenant


def cohort_members(tenancy: Tenancy, cohort: str) -> tuple[str, ...]:
    """The leaf tenants that share the cohort's quota, sorted (the order rows are locked in)."""
    if cohort not in tenancy.tenants:
        return (cohort,)
    return tuple(sorted(QuotaBook.from_usage(tenancy, {}).cohort_members(cohort)))


def limit_units(tenancy: Tenancy, tenant: str, flavor: str) -> int | None:
    """``nominal + borrowing_limit``: the most a leaf may ever hold (None: only its cohort bounds it)."""
    quota = tenancy.tenants[tenant].flavor_quota(flavor)
    return None if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit


def cap_units(tenancy: Tenancy, tenant: str, flavor: str) -> int:
    """The most a tenant could hold of a flavor with the rest of its cohort idle (reported in events)."""
    most = QuotaBook.from_usage(tenancy, {}).most_ever(tenant, flavor)
    return int(most) if most != float("inf") else 0


def priority_class_for(tenancy: Tenancy, priority: int) -> str:
    """A spec's integer priority as a class: the class with exactly that value; 0 (a spec's default) or a
    value no class has means the tenancy's default class."""
    if priority:
        for name, value in tenancy.priority_classes.items():
            if value == priority:
                return name
    return tenancy.default_priority_class


def to_pending(tenancy: Tenancy, job: QueuedJob) -> PendingJob | str:
    """The core's pending job, or why the request cannot be charged at all."""
    ask = GpuAsk(gpus=job.gpus, models=(job.gpu_model,) if job.gpu_model else ())
    try:
        return pending_job(tenancy, job.job_id, job.tenant, ask, job.queued_at_s,
                           priority_class_for(tenancy, job.priority))
    except UnitError as exc:
        return f"job cannot be charged to quota: {exc}"
