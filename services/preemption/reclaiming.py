"""The reclaim path: quota asks to return borrowed capacity of one flavor to a tenant under its nominal
quota (``ReclaimRequested``). For the request's first blocked job: load the cluster as placement sees
it, let the selection core choose victims among the borrowers (``selection.plan_reclaim``), stop them
through the same protocol as a priority preemption, hold the freed GPUs for the blocked job, and
remember the victims so that a repeated request counts what is already being given back."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.jobs import append_job_events, load_job

from gpusched_core import placement as engine
from services.placement.cycle import nomination_id
from services.placement.placing import load_cluster, lock_cycle
from gpusched_core import preemption as sel
from services.preemption.protocol import (
    SERVICE,
    PreemptionSettings,
    Stopped,
    charged_tenant,
    load_running,
    nominate,
    record_evaluation,
    stop_victims,
)
from services.preemption.requests import quota_units_of, reclaim_ask, request_of

log = logging.getLogger(__name__)

WAITING = frozenset({decider.JobStatus.ADMITTED, decider.JobStatus.QUEUED})  # blocked: not placed yet


async def reclaim(conn: asyncpg.Connection, request: ev.ReclaimRequested, settings: PreemptionSettings,
                  now: datetime) -> sel.PreemptionPlan | None:
    """Answer one reclaim request; returns the plan (None when its job no longer waits)."""
    await lock_cycle(conn)
    if not request.for_jobs:
        log.info("reclaim for tenant %s names no blocked job; nothing to do", request.tenant)
        return None
    job_id = request.for_jobs[0]
    state = await load_job(conn, job_id)
    charged = await charged_tenant(conn, job_id, state.spec.tenant) if state.spec is not None else None
    if state.spec is None or state.status not in WAITING or charged != request.tenant:
        log.info("reclaim for job %s of tenant %s: nothing to do, the job is %s%s", job_id, request.tenant,
                 state.status.value if state.status else "unknown",
                 f" and charged to {charged}" if charged not in (None, request.tenant) else "")
        return None
    ask = reclaim_ask(request)
    spec = state.spec
    preemptor = sel.Preemptor(job_id, request.tenant, spec.priority, request_of(job_id, spec, ask.flavor),
                              quota_units_of(spec, ask.flavor))
    freed = await load_freed(conn, job_id)
    _, snapshot = await load_cluster(conn)
    held = engine.RequestId(nomination_id(job_id))
    if held in snapshot.allocations:  # GPUs already held for this job are its own
        snapshot = engine.release(snapshot, held)
    running = await load_running(conn)
    plan = sel.plan_reclaim(snapshot, preemptor, ask, running, freed, now.timestamp(),
                            quota_reserved=state.status is decider.JobStatus.QUEUED, config=settings.config)
    await record_evaluation(conn, plan, now)
    log.info("reclaim for job %s of tenant %s: %s", job_id, request.tenant, plan.reasons[1])
    await forget_accounted(conn, job_id, freed, ask.requested_at_s)
    if plan.outcome == "preempt":
        stopped = await stop_victims(conn, preemptor, plan.victims, settings, now)
        await remember(conn, job_id, ask.flavor, stopped, {job.job_id: job.units for job in running}, now)
        await nominate(conn, job_id, plan.placement, now)
        if state.status is decider.JobStatus.QUEUED:  # its stream can say why (an Admitted one has no command)
            command = decider.SelectVictims(plan.victim_ids, tuple(sorted({n for s in stopped for n in s.node_ids})),
                                            "; ".join(plan.reasons))
            await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
    return plan


async def load_freed(conn: asyncpg.Connection, job_id: str) -> list[sel.FreedFor]:
    """Jobs earlier reclaims preempted for ``job_id`` that still stop, or whose quota went back (and when).
    A victim that runs again without having given its quota back (its node was lost mid-grace, say)
    frees nothing and is left out."""
    rows = await conn.fetch(
        "SELECT v.victim_job_id, v.units, q.released_at FROM reclaim_victims v"
        " JOIN jobs j ON j.job_id = v.victim_job_id"
        " LEFT JOIN LATERAL (SELECT min(e.occurred_at) AS released_at FROM events e"
        "   WHERE e.stream_id = 'job-' || v.victim_job_id AND e.type = 'QuotaReleased' AND e.version > v.version) q"
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
