"""Preemption's Kafka edge. Two triggers:

- a job whose placement was deferred (``PlacementDeferred`` on the job events): ask the selection core
  whom of lower priority to preempt for it;
- a quota ``ReclaimRequested`` (``gpusched.quota.reclaims``): return capacity that borrowers hold to a
  tenant under its nominal quota (``reclaiming``).

Each runs under placement's cycle lock, so the snapshot it decides on is the one placement would use,
and the GPUs it nominates for the preemptor cannot be handed to anyone else in between.
"""

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

from services.placement.placing import load_cluster, lock_cycle
from gpusched_core import preemption as sel
from services.preemption.protocol import (
    SERVICE,
    PreemptionSettings,
    charged_tenant,
    load_running,
    nominate,
    record_evaluation,
    stop_victims,
)
from services.preemption.reclaiming import reclaim
from services.preemption.requests import request_of

__all__ = ["SERVICE", "PreemptionSettings", "consider", "make_handler", "make_reclaim_handler"]


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


def make_reclaim_handler(settings: PreemptionSettings, clock: Callable[[], datetime]) -> TxHandler:
    async def on_reclaim(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, ev.ReclaimRequested):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return  # a redelivery: its victims (if any) are already stopping
        # in arrival order within the batch (deferred work runs sorted by key)
        key = f"reclaim:{message.partition:05d}:{message.offset:015d}"
        batch.after(key, lambda c: reclaim(c, payload, settings, clock()))

    return on_reclaim


async def consider(conn: asyncpg.Connection, job_id: str, settings: PreemptionSettings, now: datetime) -> None:
    await lock_cycle(conn)
    state = await load_job(conn, job_id)
    if state.status is not decider.JobStatus.QUEUED or state.spec is None:
        return  # placed (or gone) since it was deferred
    if await conn.fetchval("SELECT 1 FROM gpu_nominations WHERE job_id = $1 LIMIT 1", job_id):
        return  # its victims are already stopping
    nodes, snapshot = await load_cluster(conn)
    spec = state.spec
    tenant = await charged_tenant(conn, job_id, spec.tenant)  # as quota compares tenants
    preemptor = sel.Preemptor(job_id, tenant, spec.priority, request_of(job_id, spec))
    plan = sel.select_victims(snapshot, preemptor, await load_running(conn), now.timestamp(), config=settings.config)
    await record_evaluation(conn, plan, now)
    if plan.outcome == "preempt":
        await preempt(conn, state, preemptor, plan, settings, now)


async def preempt(conn: asyncpg.Connection, state: decider.JobState, preemptor: sel.Preemptor,
                  plan: sel.PreemptionPlan, settings: PreemptionSettings, now: datetime) -> None:
    """Stop the victims, hold the slot, and record the decision on the preemptor's stream."""
    assert plan.placement is not None
    stopped = await stop_victims(conn, preemptor, plan.victims, settings, now)
    await nominate(conn, state.job_id, plan.placement, now)
    node_ids = tuple(sorted({node for s in stopped for node in s.node_ids}))
    reason = "; ".join(plan.reasons) or f"preempting {', '.join(plan.victim_ids)}"
    command = decider.SelectVictims(plan.victim_ids, node_ids, reason)
    await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
