"""Quota's Kafka edge: job events in; reservations and releases appended with the outbox."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.store import claim

from services.quota.config import QuotaConfig
from services.quota.core import Ledger, PendingJob, plan_reservations

SERVICE = "quota"
_TERMINAL = (ev.JobSucceeded, ev.JobFailed, ev.JobCancelled)


def make_job_event_handler(config: QuotaConfig, clock: Callable[[], datetime]) -> TxHandler:
    async def on_job_event(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, (ev.JobAdmitted, ev.JobPreempted, *_TERMINAL)):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        if isinstance(payload, ev.JobPreempted):
            # the preempted job gives its quota back and queues for it again, to resume later
            tenant = await release(conn, payload.job_id, clock())
            state = await load_job(conn, payload.job_id)
            if tenant is None or state.spec is None:
                return
            await queue_for_quota(conn, payload.job_id, state.spec)
        elif isinstance(payload, ev.JobAdmitted):
            tenant = payload.spec.tenant
            await queue_for_quota(conn, payload.job_id, payload.spec)
        else:
            tenant = await release(conn, payload.job_id, clock())
            if tenant is None:
                return

        async def reserve(c: asyncpg.Connection) -> None:
            await reserve_for_tenant(c, tenant, config.cap_for(tenant), clock())

        batch.after(f"reserve:{tenant}", reserve)  # one reservation pass per tenant per batch

    return on_job_event


async def queue_for_quota(conn: asyncpg.Connection, job_id: str, spec: ev.JobSpec) -> None:
    await conn.execute(
        "INSERT INTO quota_pending (job_id, tenant, gpus, priority, submitted_at)"
        " VALUES ($1, $2, $3, $4, (SELECT submitted_at FROM jobs WHERE job_id = $1)) ON CONFLICT DO NOTHING",
        job_id, spec.tenant, spec.gpus, spec.priority)


async def release(conn: asyncpg.Connection, job_id: str, now: datetime) -> str | None:
    """Return a finished job's GPUs to its tenant; the tenant, or None when it held no quota."""
    await conn.execute("DELETE FROM quota_pending WHERE job_id = $1", job_id)
    state = await load_job(conn, job_id)
    if not state.quota_held or state.spec is None:
        return None
    tenant = state.spec.tenant
    reserved = await conn.fetchval(
        "UPDATE quota_ledger SET reserved_gpus = reserved_gpus - $2 WHERE tenant = $1 RETURNING reserved_gpus",
        tenant, state.spec.gpus)
    await append_job_events(conn, state, decider.decide(state, decider.ReleaseQuota(reserved), now),
                            producer=SERVICE, now=now)
    return tenant


async def reserve_for_tenant(conn: asyncpg.Connection, tenant: str, cap: int, now: datetime) -> None:
    await conn.execute("INSERT INTO quota_ledger (tenant, cap_gpus) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                       tenant, cap)
    # FOR UPDATE serialises decisions for one tenant across quota replicas; the CHECK constraint on
    # reserved_gpus <= cap_gpus is the last line of defence.
    row = await conn.fetchrow("SELECT cap_gpus, reserved_gpus FROM quota_ledger WHERE tenant = $1 FOR UPDATE",
                              tenant)
    rows = await conn.fetch(
        "SELECT job_id, gpus, priority, seq, submitted_at, last_reason FROM quota_pending WHERE tenant = $1", tenant)
    pending = [PendingJob(r["job_id"], r["gpus"], r["priority"], r["seq"], r["submitted_at"]) for r in rows]
    last_reason = {r["job_id"]: r["last_reason"] for r in rows}
    reservations, deferrals = plan_reservations(Ledger(tenant, row["cap_gpus"], row["reserved_gpus"]), pending)
    gpus_of = {job.job_id: job.gpus for job in pending}
    added = 0
    for reservation in reservations:
        state = await load_job(conn, reservation.job_id)
        command = decider.ReserveQuota(reservation.tenant_reserved_gpus, row["cap_gpus"])
        if await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now) \
                is not state:
            added += gpus_of[reservation.job_id]
        await conn.execute("DELETE FROM quota_pending WHERE job_id = $1", reservation.job_id)
    if added:
        await conn.execute("UPDATE quota_ledger SET reserved_gpus = reserved_gpus + $2 WHERE tenant = $1",
                           tenant, added)
    for deferral in deferrals:
        if last_reason[deferral.job_id] == deferral.reason:
            continue
        state = await load_job(conn, deferral.job_id)
        await append_job_events(conn, state, decider.decide(state, decider.DeferQuota(deferral.reason), now),
                                producer=SERVICE, now=now)
        await conn.execute("UPDATE quota_pending SET last_reason = $2 WHERE job_id = $1", deferral.job_id,
                           deferral.reason)
