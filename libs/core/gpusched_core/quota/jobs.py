"""Pure glue between job specs and the quota policy core: what a job asks for, cohorts, database limits."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_common import events as ev

from gpusched_core.quota import GpuAsk, PendingJob, QuotaBook, Tenancy, UnitError, pending_job


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A row of ``quota_policy_pending``: what a job asks for, as its spec says it. ``tenant`` is the
    spec's tenant; the tenancy decides which leaf it is charged to (``Tenancy.charged_tenant``). Slotted:
    every cycle reads its cohort's whole queue (tens of thousands of jobs in a backlog)."""

    job_id: str
    tenant: str
    gpus: int  # whole GPUs per node (1 for a share or a MIG slice)
    gpu_model: str | None
    priority: int
    queued_at_s: float
    last_reason: str | None = None
    nodes: int = 1  # a gang: ``nodes`` x ``gpus`` whole GPUs
    share_milli: int | None = None  # a share of one GPU
    mig_profile: str | None = None  # one MIG slice
    last_reason_at_s: float | None = None  # when ``last_reason`` was recorded

    def ask(self) -> GpuAsk:
        """The request in quota terms: whole GPUs over the gang, a milli share, or one MIG slice."""
        models = (self.gpu_model,) if self.gpu_model else ()
        if self.share_milli is not None:
            return GpuAsk(share_milli=self.share_milli, models=models)
        if self.mig_profile is not None:
            return GpuAsk(mig_profile=self.mig_profile, models=models)
        return GpuAsk(gpus=self.gpus * self.nodes, models=models)


def queued_job(job_id: str, spec: ev.JobSpec, queued_at_s: float) -> QueuedJob:
    share = spec.gpu_share
    return QueuedJob(job_id, spec.tenant, spec.gpus, spec.gpu_model, spec.priority, queued_at_s, nodes=spec.nodes,
                     share_milli=share.milli if share is not None else None, mig_profile=spec.mig_profile)


def cohort_of(tenancy: Tenancy, tenant: str) -> str:
    """The cohort root a tenant's jobs are charged in; an unknown tenant (and no guest tenant) is a cohort
    of its own (it shares nothing)."""
    charged = tenancy.charged_tenant(tenant)
    return tenancy.root_of(charged) if charged in tenancy.tenants else charged


def cohort_members(tenancy: Tenancy, cohort: str) -> tuple[str, ...]:
    """The leaf tenants that share the cohort's quota, sorted (the order rows are locked in)."""
    if cohort not in tenancy.tenants:
        return (cohort,)
    return tuple(sorted(QuotaBook.from_usage(tenancy, {}).cohort_members(cohort)))


def cohort_names(tenancy: Tenancy, cohort: str) -> tuple[str, ...]:
    """Every tenant name under the cohort's root, organisations included (a job naming an organisation
    waits in the cohort it belongs to, with the reason it is refused)."""
    if cohort not in tenancy.tenants:
        return (cohort,)
    return tuple(sorted(name for name in tenancy.tenants if tenancy.root_of(name) == cohort))


def takes_guests(tenancy: Tenancy, cohort: str) -> bool:
    """Whether the cohort is charged for the jobs of tenants the tenancy does not name."""
    guest = tenancy.guest_tenant
    return guest is not None and tenancy.root_of(guest) == cohort


def limit_units(tenancy: Tenancy, tenant: str, flavor: str) -> int | None:
    """``nominal + borrowing_limit``: the most a leaf may ever hold (None: only its cohort bounds it)."""
    quota = tenancy.tenants[tenant].flavor_quota(flavor)
    return None if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit


@dataclass(frozen=True)
class UsageLimits:
    """The limits of one ``quota_policy_usage`` row: its nominal quota and the most it may hold (None: only
    its cohort bounds it)."""

    tenant: str
    flavor: str
    nominal_units: int
    limit_units: int | None


def limits_in_force(tenancy: Tenancy, held: Mapping[tuple[str, str], int]) -> list[UsageLimits]:
    """The limits of every usage row once ``tenancy`` is in force, given what each (tenant, flavor) holds
    now: every leaf's own, except that a limit below what the tenant holds is raised to what it holds (it
    drains: nothing new fits until usage falls under the new limit); a tenant or flavor the tenancy no
    longer names keeps only what it holds (nominal 0: nothing new fits, what runs drains)."""
    out = []
    for tenant in sorted(tenancy.leaves()):
        for flavor in tenancy.flavors:
            limit = limit_units(tenancy, tenant, flavor)
            if limit is not None:
                limit = max(limit, held.get((tenant, flavor), 0))
            out.append(UsageLimits(tenant, flavor, tenancy.nominal_units(tenant, flavor), limit))
    named = {(row.tenant, row.flavor) for row in out}
    out += [UsageLimits(tenant, flavor, 0, units) for (tenant, flavor), units in sorted(held.items())
            if (tenant, flavor) not in named]
    return out


def cap_units(tenancy: Tenancy, tenant: str, flavor: str) -> int:
    """The most a tenant could hold of a flavor with the rest of its cohort idle (reported in events)."""
    if tenant not in tenancy.tenants:
        return 0
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
    """The core's pending job, charged to its tenant's leaf, or why the request cannot be charged at all."""
    try:
        return pending_job(tenancy, job.job_id, tenancy.charged_tenant(job.tenant), job.ask(), job.queued_at_s,
                           priority_class_for(tenancy, job.priority))
    except UnitError as exc:
        return f"job cannot be charged to quota: {exc}"


def chargeable(tenancy: Tenancy, jobs: Iterable[QueuedJob]) -> tuple[list[PendingJob], list[tuple[str, str]]]:
    """The core's pending jobs, and (job id, reason) for each request that cannot be charged at all. A queue
    holds a few shapes many times over: each (tenant, request, priority) is worked out once."""
    pending: list[PendingJob] = []
    refused: list[tuple[str, str]] = []
    shapes: dict[tuple, PendingJob | str] = {}
    for job in jobs:
        shape = (job.tenant, job.gpus, job.gpu_model, job.priority, job.nodes, job.share_milli, job.mig_profile)
        known = shapes.get(shape)
        if known is None:
            known = shapes[shape] = to_pending(tenancy, job)
        if isinstance(known, str):
            refused.append((job.job_id, known))
        else:
            pending.append(PendingJob(job.job_id, known.tenant, known.ask, known.priority_class, job.queued_at_s))
    return pending, refused


def as_guest(tenancy: Tenancy, job: QueuedJob, reason: str) -> str:
    """A reason about a guest's job says whose quota it waits for."""
    charged = tenancy.charged_tenant(job.tenant)
    if charged == job.tenant:
        return reason
    return f"{reason} (tenant {job.tenant} is not in the tenancy file; charged to {charged})"
