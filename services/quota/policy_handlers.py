"""Quota's Kafka edge with the policy core (``GPUSCHED_TENANTS_FILE``): cohorts, borrowing, fair share.

Per batch, each touched cohort gets one reservation cycle (``reserve_for_cohort``): lock the cohort's usage
rows, build a ``QuotaSnapshot``, ``plan_cycle``, append ``QuotaReserved`` / ``QuotaDeferred``, charge the
rows. Releases lock the same rows first. Two quota processes therefore decide one cohort in turn, and the
``quota_policy_usage`` CHECK refuses any charge above ``nominal + borrowing_limit`` should that ever fail.

A release runs in the message's own handler, so a batch that releases in two cohorts takes their locks in
message order; should two replicas cross that way, PostgreSQL aborts one and the batch is replayed message
by message (one cohort per transaction), which cannot deadlock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.decider import JobStatus
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.store import claim

from services.quota import policy_store as store
from services.quota.handlers import SERVICE
from services.quota.policy import (
    UNITS_PER_GPU,
    QuotaPlan,
    QuotaSnapshot,
    Reservation,
    Tenancy,
    UsageHistory,
    advance,
    plan_cycle,
    rate_geq,
)
from services.quota.tenancy import QueuedJob, cap_units, cohort_members, cohort_of, to_pending

log = logging.getLogger(__name__)
_TERMINAL = (ev.JobSucceeded, ev.JobFailed, ev.JobCancelled)


def make_policy_job_event_handler(tenancy: Tenancy, clock: Callable[[], datetime]) -> TxHandler:
    async def on_job_event(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, (ev.JobAdmitted, ev.JobPreempted, *_TERMINAL)):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        now = clock()
        if isinstance(payload, ev.JobAdmitted):
            tenant: str | None = payload.spec.tenant
            await store.queue_job(conn, queued(payload.job_id, payload.spec, payload.submitted_at))
        else:
            tenant = await release(conn, tenancy, payload.job_id, now)
            if tenant is not None and isinstance(payload, ev.JobPreempted):
                # the preempted job gives its quota back and queues for it again, to resume later
                spec = (await load_job(conn, payload.job_id)).spec
                if spec is not None:
                    await store.queue_job(conn, queued(payload.job_id, spec, now))
        if tenant is None:
            return
        cohort = cohort_of(tenancy, tenant)

        async def reserve(c: asyncpg.Connection) -> None:
            await reserve_for_cohort(c, tenancy, cohort, clock())

        batch.after(f"reserve:{cohort}", reserve)  # one cycle per cohort per batch

    return on_job_event


def queued(job_id: str, spec: ev.JobSpec, at: datetime) -> QueuedJob:
    return QueuedJob(job_id, spec.tenant, spec.gpus, spec.gpu_model, spec.priority, at.timestamp())


async def release(conn: asyncpg.Connection, tenancy: Tenancy, job_id: str, now: datetime) -> str | None:
    """Give a finished (or preempted) job's units back; its tenant, or None when it held no quota."""
    await store.unqueue_job(conn, job_id)
    state = await load_job(conn, job_id)
    if not state.quota_held or state.spec is None:
        return None
    held = await store.load_reservation(conn, job_id)
    if held is None:  # reserved under flat caps before the switch: give it back there
        left = await conn.fetchval("UPDATE quota_ledger SET reserved_gpus = greatest(0, reserved_gpus - $2)"
                                   " WHERE tenant = $1 RETURNING reserved_gpus", state.spec.tenant, state.spec.gpus)
        await _append(conn, job_id, decider.ReleaseQuota(left or 0), now)
        return state.spec.tenant
    tenant, flavor, units = held["tenant"], held["flavor"], held["units"]
    usage = await store.lock_usage(conn, tenancy, cohort_members(tenancy, cohort_of(tenancy, tenant)))
    await _advance_history(conn, tenancy, tenant, usage.get(tenant, {}), now)
    left = await store.charge(conn, tenant, flavor, -units)
    await store.forget_reservation(conn, job_id)
    await _append(conn, job_id, decider.ReleaseQuota(left // UNITS_PER_GPU), now)
    return tenant


async def reserve_for_cohort(conn: asyncpg.Connection, tenancy: Tenancy, cohort: str,
                             now: datetime) -> QuotaPlan | None:
    """One reservation cycle for a cohort, inside the caller's transaction; the plan (None: nothing waits)."""
    members = cohort_members(tenancy, cohort)
    usage = await store.lock_usage(conn, tenancy, members)  # FOR UPDATE: one decider per cohort at a time
    jobs = await store.load_queued(conn, members)
    if not jobs:
        return None
    last_reason = {job.job_id: job.last_reason for job in jobs}
    pending, unchargeable = [], []
    for job in jobs:
        charge = to_pending(tenancy, job)
        (unchargeable.append((job.job_id, charge)) if isinstance(charge, str) else pending.append(charge))
    history = await store.load_history(conn, members)
    plan = plan_cycle(QuotaSnapshot(tenancy, usage, history, now.timestamp()), pending)
    held = {tenant: dict(per_flavor) for tenant, per_flavor in usage.items()}  # the snapshot stays as planned
    await _reserve(conn, tenancy, plan.reservations, held, now)
    reasons = [(w.job_id, w.reason) for w in plan.waiting] + unchargeable
    for job_id, reason in reasons:
        if last_reason[job_id] != reason:
            await _defer(conn, job_id, reason, now)
    if plan.reclaims:
        log.info("quota: cohort %s needs reclaims (not yet sent to preemption): %s", cohort, plan.reclaims)
    return plan


async def _reserve(conn: asyncpg.Connection, tenancy: Tenancy, reservations: tuple[Reservation, ...],
                   usage: dict[str, dict[str, int]], now: datetime) -> None:
    for r in reservations:
        state = await load_job(conn, r.job_id)
        if state.status is not JobStatus.ADMITTED or state.quota_held:
            await store.unqueue_job(conn, r.job_id)  # finished or reserved meanwhile: nothing to charge
            continue
        held = usage.setdefault(r.tenant, {})
        await _advance_history(conn, tenancy, r.tenant, held, now)  # at the rate held until now
        total = await store.charge(conn, r.tenant, r.flavor, r.units)
        held[r.flavor] = total
        command = decider.ReserveQuota(total // UNITS_PER_GPU, cap_units(tenancy, r.tenant, r.flavor) // UNITS_PER_GPU,
                                       gpu_model=r.flavor, borrowed_gpus=r.borrowed_units / UNITS_PER_GPU)
        await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
        await store.record_reservation(conn, r.job_id, r.tenant, r.flavor, r.units)


async def _defer(conn: asyncpg.Connection, job_id: str, reason: str, now: datetime) -> None:
    state = await load_job(conn, job_id)
    if state.status is not JobStatus.ADMITTED:
        await store.unqueue_job(conn, job_id)
        return
    await append_job_events(conn, state, decider.decide(state, decider.DeferQuota(reason), now),
                            producer=SERVICE, now=now)
    await store.set_last_reason(conn, job_id, reason)


async def _advance_history(conn: asyncpg.Connection, tenancy: Tenancy, tenant: str, held: dict[str, int],
                           now: datetime) -> None:
    """Before a tenant's usage changes: accrue what it held since its history was last advanced."""
    now_s = now.timestamp()
    past = (await store.load_history(conn, (tenant,))).get(tenant, UsageHistory(now_s))
    await store.save_history(conn, tenant, advance(past, now_s, rate_geq(tenancy, held), tenancy.half_life_s))


async def _append(conn: asyncpg.Connection, job_id: str, command: decider.ReleaseQuota, now: datetime) -> None:
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
