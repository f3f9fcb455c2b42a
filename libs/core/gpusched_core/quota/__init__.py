"""Tenants, quotas and fair share: the pure core of the quota service (no I/O, clock or randomness).

What the live quota service does, per cycle (for one cohort, inside the transaction that holds the
cohort's ledger rows ``FOR UPDATE``)::

    tenancy = load_tenancy(text)                                # once, and on each admin change
    snapshot = QuotaSnapshot(tenancy, usage, history, now_s)   # usage: reserved units per tenant/flavor
    plan = plan_cycle(snapshot, pending)                        # pending: list[PendingJob]
    for r in plan.reservations:   append QuotaReserved(job, r.flavor, r.units, r.borrowed_units, r.geq)
    for job, _, reason in plan.reasons():   record the reason when it changed
    plan.waiting                  # ranked on demand: w.position / w.describe() for a reader
    for c in plan.reclaims:       publish the reclaim request to the preemption service
    persist plan.usage (per tenant/flavor) and, for every tenant whose usage changed,
    history = advance(history, now_s, rate_geq(tenancy, old_usage), tenancy.half_life_s)

On release: ``advance`` the tenant's history to the release time at its old rate, then subtract the
reservation's units. ``pending_job(...)`` turns a job spec into a ``PendingJob``.
"""

from .decay import UsageHistory, accrued, advance, average_rate, decay_factor, decayed
from .ledger import QuotaBook
from .loader import SUPPORTED_VERSIONS, TenancyError, load_tenancy, parse_tenancy
from .model import FlavorQuota, QuotaTree, Tenancy, Tenant
from .ordering import ORDERS, FairShareOrder, FifoOrder, JobOrder, PendingJob, order_by_name
from .backfill import BlockedWork
from .planner import Candidate, QuotaCycle, QuotaPlan, ReclaimRequest, Reservation, order_pending, plan_cycle
from .queues import PendingQueue, build_queues, priority_value
from .reasons import WAITING_FOR_CAPACITY, WaitCategory, WaitingJob
from .snapshot import QuotaSnapshot, dominant_share, dominant_shares, history_now, rate_geq
from .units import (
    UNITS_PER_GPU,
    GpuAsk,
    QuotaAsk,
    UnitError,
    format_gpus,
    gpu_equivalents,
    gpus_to_units,
    quota_ask,
    units_for,
    units_to_gpus,
    whole_gpus,
)


def pending_job(tenancy: Tenancy, job_id: str, tenant: str, ask: GpuAsk, submitted_at_s: float,
                priority_class: str | None = None) -> PendingJob:
    """A pending job from a request: charged per ``ask``; the tenancy's default priority class when
    none is given."""
    charge = quota_ask(ask, tenancy.preferred_flavors(tenant) if tenant in tenancy.tenants else tenancy.flavors,
                       tenancy.mig_slices_per_gpu)
    return PendingJob(job_id, tenant, charge, priority_class or tenancy.default_priority_class, submitted_at_s)


__all__ = [
    "ORDERS", "SUPPORTED_VERSIONS", "UNITS_PER_GPU",
    "BlockedWork", "Candidate", "FairShareOrder", "FifoOrder", "FlavorQuota", "GpuAsk", "JobOrder", "PendingJob",
    "PendingQueue", "QuotaAsk", "QuotaBook", "QuotaCycle", "QuotaPlan", "QuotaSnapshot", "QuotaTree",
    "ReclaimRequest", "Reservation", "Tenancy", "TenancyError", "Tenant", "UnitError", "UsageHistory",
    "WAITING_FOR_CAPACITY", "WaitCategory", "WaitingJob",
    "accrued", "advance", "average_rate", "build_queues", "decay_factor", "decayed", "dominant_share",
    "dominant_shares", "format_gpus", "gpu_equivalents", "gpus_to_units", "history_now", "load_tenancy",
    "order_by_name", "order_pending", "parse_tenancy", "pending_job", "plan_cycle", "priority_value",
    "quota_ask", "rate_geq", "units_for", "units_to_gpus", "whole_gpus",
]  # fmt: skip
