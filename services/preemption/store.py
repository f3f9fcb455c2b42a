"""All of the preemption service's SQL, shared by the priority and the reclaim path: load who runs where,
ask victims to stop (their stream, then ``PreemptJob`` to every node of their run), record what an
evaluation decided, and remember reclaim victims. The cluster and the GPUs held for a preemptor are
placement's (``gpusched_common.stores.cluster``); reservations are quota's (``gpusched_common.stores.quota``);
who runs where with what quota charges them is read through ``gpusched_common.stores.running``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import events as ev
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.store import enqueue
from gpusched_common.stores.quota import reserved_tenants
from gpusched_common.stores.tenancy import TenancyStore
from gpusched_common.topics import NODES_COMMANDS
from gpusched_common.tracing import current_traceparent

from gpusched_core import lifecycle
from gpusched_core import preemption as sel
from gpusched_core.preemption.jobs import member_nodes, preempt_commands
from services.preemption.settings import PreemptionPolicy

SERVICE = "preemption"


@dataclass(frozen=True)
class Stopped:
    """A victim asked to stop: its state after ``PreemptionRequested`` and the nodes told to stop it."""

    state: lifecycle.JobState
    node_ids: tuple[str, ...]


async def charged_tenant(conn: asyncpg.Connection, job_id: str, tenant: str, tenancies: TenancyStore) -> str:
    """The tenant quota charges a job to (the one its decisions compare): its reservation's, or for a job
    without one the tenancy's leaf for ``tenant`` (a guest's is the tenancy's ``guest_tenant``)."""
    return (await charged_tenants(conn, {job_id: tenant}, tenancies))[job_id]


async def charged_tenants(conn: asyncpg.Connection, tenants: dict[str, str], tenancies: TenancyStore) -> dict[str, str]:
    """``charged_tenant`` of each job (``tenants``: each job's spec tenant), in one query for all."""
    reserved = await reserved_tenants(conn, list(tenants))
    unreserved = [job_id for job_id in tenants if job_id not in reserved]
    tenancy = await tenancies.read(conn) if unreserved else None
    return {job_id: reserved.get(job_id) or (tenancy.charged_tenant(tenant) if tenancy is not None else tenant)
            for job_id, tenant in tenants.items()}


async def stop_victims(conn: asyncpg.Connection, preemptor: sel.Preemptor, victims: Sequence[sel.Victim],
                       policy: PreemptionPolicy, now: datetime) -> list[Stopped]:
    """``PreemptionRequested`` on each victim's stream and ``PreemptJob`` to every node of its run (all
    members of a gang); a victim that stopped or was asked already is skipped."""
    deadline = now + timedelta(seconds=policy.grace_s)
    stopped = []
    for victim in victims:
        state = await load_job(conn, victim.job_id)
        command = lifecycle.RequestPreemption(preemptor.job_id, preemptor.priority, preemptor.tenant, victim.reason,
                                            policy.grace_s, deadline)
        events = lifecycle.decide(state, command, now)
        if not events or not member_nodes(state):
            continue
        after = await append_job_events(conn, state, events, producer=SERVICE, now=now)
        commands = preempt_commands(state, policy.grace_s, deadline, victim.reason)
        for payload in commands:
            await send_command(conn, payload, now)
        stopped.append(Stopped(after, tuple(c.node_id for c in commands)))
    return stopped


async def send_command(conn: asyncpg.Connection, payload: ev.PreemptJob, now: datetime) -> None:
    """To the node's agent, through this service's own outbox (its relay publishes it)."""
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{payload.node_id}",
                                occurred_at=now, producer=SERVICE, traceparent=current_traceparent())
    await enqueue(conn, producer=SERVICE, topic=NODES_COMMANDS.name, key=payload.node_id, envelopes=[envelope])


async def record_evaluation(conn: asyncpg.Connection, plan: sel.PreemptionPlan, now: datetime) -> None:
    await record_evaluations(conn, [plan], now)


async def record_evaluations(conn: asyncpg.Connection, plans: Sequence[sel.PreemptionPlan], now: datetime) -> None:
    """What each evaluation decided and why (the latest per job), one statement for all."""
    if not plans:
        return
    await conn.execute(
        "INSERT INTO preemption_evaluations (job_id, evaluated_at, outcome, reasons)"
        " SELECT p.job_id, $2, p.outcome, p.reasons"
        " FROM jsonb_to_recordset($1::text::jsonb) AS p(job_id text, outcome text, reasons jsonb)"
        " ON CONFLICT (job_id) DO UPDATE SET evaluated_at = EXCLUDED.evaluated_at,"
        " outcome = EXCLUDED.outcome, reasons = EXCLUDED.reasons",
        json.dumps([{"job_id": p.preemptor_id, "outcome": p.outcome, "reasons": list(p.reasons)}
                    for p in {p.preemptor_id: p for p in plans}.values()]), now)


async def load_freed(conn: asyncpg.Connection, job_id: str) -> list[sel.FreedFor]:
    """Jobs earlier reclaims preempted for ``job_id`` that still stop, or whose quota went back (and when).
    A victim that runs again without having given its quota back (its node was lost mid-grace, say)
    frees nothing and is left out."""
    rows = await conn.fetch(
        "SELECT v.victim_job_id, v.units, q.released_at FROM reclaim_victims v"
        " JOIN jobs j ON j.job_id = v.victim_job_id"
        " LEFT JOIN LATERAL (SELECT min(e.occurred_at) AS released_at FROM events e"
        "   WHERE e.stream_id = job_stream(v.victim_job_id) AND e.type = 'QuotaReleased' AND e.version > v.version) q"
        "   ON true"
        " WHERE v.for_job_id = $1 AND (q.released_at IS NOT NULL OR j.status IN ('Preempting', 'Preempted'))"
        " ORDER BY v.victim_job_id, v.version", job_id)
    return [sel.FreedFor(r["victim_job_id"], r["units"], r["released_at"].timestamp() if r["released_at"] else None)
            for r in rows]


async def remember(conn: asyncpg.Connection, for_job: str, flavor: str, stopped: list[Stopped],
                   units: dict[str, int], now: datetime) -> None:
    """Record each victim (at the stream version that asked it to stop) for the blocked job."""
    await conn.executemany(
        "INSERT INTO reclaim_victims (victim_job_id, version, for_job_id, flavor, units, requested_at)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
        [(s.state.job_id, s.state.version, for_job, flavor, units.get(s.state.job_id, 0), now) for s in stopped])


async def forget_accounted(conn: asyncpg.Connection, job_id: str, freed: list[sel.FreedFor],
                           requested_at_s: float) -> None:
    """Victims whose quota went back before this request was made are in quota's numbers already."""
    done = [f.job_id for f in freed if f.quota_released_at_s is not None and f.quota_released_at_s <= requested_at_s]
    if done:
        await conn.execute("DELETE FROM reclaim_victims WHERE for_job_id = $1 AND victim_job_id = ANY($2::text[])",
                           job_id, done)
