"""Preemption's Kafka edge: for a job whose placement was deferred, ask the selection core whom to
preempt, then record the decision on both sides and tell the victims' agents.

Runs under placement's cycle lock, so the snapshot it decides on is the one placement would use, and
the GPUs it nominates for the preemptor cannot be handed to anyone else in between.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.store import claim

from services.placement.core import PendingJob
from services.placement.cycle import request_for
from services.placement.placing import load_cluster, lock_cycle, send_command
from services.preemption import selection as sel

SERVICE = "preemption"


@dataclass(frozen=True)
class PreemptionSettings:
    grace_s: float
    config: sel.SelectionConfig


def make_handler(settings: PreemptionSettings, clock: Callable[[], datetime]) -> TxHandler:
    async def on_job_event(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, ev.PlacementDeferred):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        job_id = payload.job_id
        batch.after(f"preempt:{job_id}", lambda c: consider(c, job_id, settings, clock()))

    return on_job_event


async def consider(conn: asyncpg.Connection, job_id: str, settings: PreemptionSettings, now: datetime) -> None:
    await lock_cycle(conn)
    state = await load_job(conn, job_id)
    if state.status is not decider.JobStatus.QUEUED or state.spec is None:
        return  # placed (or gone) since it was deferred
    if await conn.fetchval("SELECT 1 FROM gpu_nominations WHERE job_id = $1 LIMIT 1", job_id):
        return  # its victims are already stopping
    nodes, snapshot = await load_cluster(conn)
    spec = state.spec
    preemptor = sel.Preemptor(job_id, spec.tenant, spec.priority,
                              request_for(PendingJob(job_id, spec.gpus, spec.gpu_model, spec.priority, 0)))
    plan = sel.select_victims(snapshot, preemptor, await load_running(conn), now.timestamp(), config=settings.config)
    await record_evaluation(conn, plan, now)
    if plan.outcome == "preempt":
        await preempt(conn, state, plan, settings, now)


async def load_running(conn: asyncpg.Connection) -> list[sel.RunningJob]:
    rows = await conn.fetch(
        "SELECT j.job_id, j.tenant, j.priority, j.status, coalesce(j.started_at, j.placed_at) AS since,"
        " (SELECT max(e.occurred_at) FROM events e WHERE e.stream_id = 'job-' || j.job_id"
        "   AND e.type = 'JobCheckpointed' AND e.occurred_at >= coalesce(j.started_at, j.placed_at)) AS ckpt"
        " FROM jobs j WHERE j.status IN ('Placed', 'Running', 'Preempting')"
        "   AND EXISTS (SELECT 1 FROM gpu_allocations a WHERE a.job_id = j.job_id) ORDER BY j.job_id")
    return [sel.RunningJob(r["job_id"], r["tenant"], r["priority"], r["since"].timestamp(), (r["job_id"],),
                           last_checkpoint_at_s=r["ckpt"].timestamp() if r["ckpt"] else None,
                           preempting=r["status"] == "Preempting") for r in rows]


async def preempt(conn: asyncpg.Connection, preemptor: decider.JobState, plan: sel.PreemptionPlan,
                  settings: PreemptionSettings, now: datetime) -> None:
    spec = preemptor.spec
    assert spec is not None and plan.placement is not None
    deadline = now + timedelta(seconds=settings.grace_s)
    node_ids = []
    for victim in plan.victims:
        state = await load_job(conn, victim.job_id)
        command = decider.RequestPreemption(preemptor.job_id, spec.priority, spec.tenant, victim.reason,
                                            settings.grace_s, deadline)
        events = decider.decide(state, command, now)
        if not events or state.node_id is None:
            continue
        await append_job_events(conn, state, events, producer=SERVICE, now=now)
        await send_command(conn, ev.PreemptJob(job_id=victim.job_id, node_id=state.node_id, grace_s=settings.grace_s,
                                               deadline_at=deadline, reason=victim.reason), state.node_id, now)
        node_ids.append(state.node_id)
    # hold the freed GPUs for the preemptor: placement offers them to no other job meanwhile
    await conn.executemany(
        "INSERT INTO gpu_nominations (node_id, gpu_index, job_id, nominated_at) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT DO NOTHING",
        [(str(b.node_id), i, preemptor.job_id, now) for b in plan.placement.bindings for i in b.gpu_indices])
    reason = "; ".join(plan.reasons) or f"preempting {', '.join(plan.victim_ids)}"
    command = decider.SelectVictims(plan.victim_ids, tuple(sorted(set(node_ids))), reason)
    await append_job_events(conn, preemptor, decider.decide(preemptor, command, now), producer=SERVICE, now=now)


async def record_evaluation(conn: asyncpg.Connection, plan: sel.PreemptionPlan, now: datetime) -> None:
    await conn.execute(
        "INSERT INTO preemption_evaluations (job_id, evaluated_at, outcome, reasons) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (job_id) DO UPDATE SET evaluated_at = EXCLUDED.evaluated_at,"
        " outcome = EXCLUDED.outcome, reasons = EXCLUDED.reasons",
        plan.preemptor_id, now, plan.outcome, list(plan.reasons))


