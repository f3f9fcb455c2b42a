"""Preemption's handlers. Two triggers:

- a job whose placement was deferred (``PlacementDeferred`` on the job events): ask the selection core
  whom of lower priority to preempt for it (``consider``), and when nobody, whom of the tenants of its
  cohort far over their fair share (``fair``: fair-share preemption, for a job that holds quota);
- a quota ``ReclaimRequested`` (``gpusched.quota.reclaims``): return capacity that borrowers hold to a
  tenant under its nominal quota (``reclaim``).

Each runs under placement's cycle lock, so the snapshot it decides on is the one placement would use,
and the GPUs it nominates for the preemptor cannot be handed to anyone else in between.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, load_job, load_jobs, stored_payload
from gpusched_common.ignored import Ignored
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.stores.quota import recorded_reclaim
from gpusched_common.store import claim
from gpusched_common.stores.cluster import (
    ClusterCache,
    deferred_jobs,
    load_cluster,
    lock_cycle,
    nominate,
    nominated,
)
from gpusched_common.stores.running import load_running, running_priorities
from gpusched_common.stores.tenancy import TenancyStore

from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core import preemption as sel
from gpusched_core.placement.cycle import nomination_id
from gpusched_core.preemption.jobs import quota_units_of, reclaim_ask, request_of
from services.preemption import store
from services.preemption.fair import fair_config, fair_triggers
from services.preemption.settings import PreemptionPolicy
from services.preemption.store import SERVICE

log = logging.getLogger(__name__)

WAITING = frozenset({lifecycle.JobStatus.ADMITTED, lifecycle.JobStatus.QUEUED})  # blocked: not placed yet
# the job events preemption claims (as ``topics.INBOX_READERS`` says: the relay counts on it)
CLAIMED_JOB_EVENTS = (ev.PlacementDeferred,)


def make_handler(policy: PreemptionPolicy, clock: Callable[[], datetime], tenancies: TenancyStore) -> TxHandler:
    cache = ClusterCache()  # the cluster as this process last read it (one per process)

    async def on_job_event(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, CLAIMED_JOB_EVENTS) or await stored_payload(conn, envelope) is None:
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        deferred: set[str] = batch.memo.setdefault("deferred", set())  # type: ignore[assignment]
        deferred.add(payload.job_id)
        batch.after("preempt", lambda c: consider_all(c, sorted(deferred), policy, clock(), tenancies, cache))

    return on_job_event


def make_reclaim_handler(policy: PreemptionPolicy, clock: Callable[[], datetime],
                         tenancies: TenancyStore) -> TxHandler:
    async def on_reclaim(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, claimed = parse_event(message)
        if not isinstance(claimed, ev.ReclaimRequested):
            return
        payload = await recorded_reclaim(conn, envelope.event_id)  # as quota recorded it, never as claimed
        if payload is None:
            NOT_SENT.note(claimed.TYPE, f"event {envelope.event_id[:40]} for tenant {claimed.tenant[:60]}")
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return  # a redelivery: its victims (if any) are already stopping
        # in arrival order within the batch (deferred work runs sorted by key)
        key = f"reclaim:{message.partition:05d}:{message.offset:015d}"
        batch.after(key, lambda c: reclaim(c, payload, policy, clock(), tenancies))

    return on_reclaim


NOT_SENT = Ignored("reclaim requests quota never sent")


async def consider(conn: asyncpg.Connection, job_id: str, policy: PreemptionPolicy, now: datetime,
                   tenancies: TenancyStore | None = None) -> None:
    """Preempt for a job placement deferred, if the selection core finds victims whose release lets it run."""
    await consider_all(conn, [job_id], policy, now, tenancies)


async def consider_all(conn: asyncpg.Connection, job_ids: list[str], policy: PreemptionPolicy, now: datetime,
                       tenancies: TenancyStore | None = None, cache: ClusterCache | None = None) -> None:
    """``consider`` each job of a batch, in order, under one hold of the cycle lock. The jobs, the GPUs
    already held for them and the tenants quota charges them to are read for all of them at once; the
    cluster (``cache``: as last read, while placement's version of it stands) and the running jobs once,
    and again only after a preemption changed them (a burst defers thousands of jobs, nearly all with
    nobody to preempt); the evaluations are written together at the end. When no running job has a lower
    priority than any of them and none is being preempted, nobody can be preempted for them whatever the
    cluster holds: that is recorded without the cycle lock, the cluster or the running jobs (a full cluster of
    one priority defers every job it queues, and placement's cycles would wait on each evaluation); under the
    lock, too, such a job is weighed against the cluster only when fair share may preempt for it (``fair``:
    its trigger, from quota's usage read before the lock), or once a preemption in the batch changed what
    runs."""
    tenancies = tenancies or TenancyStore()
    waiting, tenants = await _waiting(conn, job_ids, tenancies)
    if not waiting:
        return  # placed (or gone) since they were deferred
    running = await running_priorities(conn)
    fair = await fair_triggers(conn, waiting, policy, now, tenancies, running[3])
    quick = _quick(waiting, tenants, running)
    if None not in quick and not fair:
        await store.record_evaluations(conn, quick, now)  # type: ignore[arg-type]  # no None among them
        return
    await lock_cycle(conn)
    waiting, tenants = await _waiting(conn, job_ids, tenancies)  # again, as the lock's last holder left them
    if not waiting:
        return
    quick = _quick(waiting, tenants, await running_priorities(conn))
    cache = cache or ClusterCache()
    cluster: tuple[engine.ClusterSnapshot, list] | None = None
    plans, preempted = [], False
    for state, known in zip(waiting, quick, strict=True):
        known = None if preempted else known  # after a preemption only the cluster can tell (jobs stopping)
        if known is not None and state.job_id not in fair:
            plans.append(known)  # nobody to preempt by priority, and no fair share to weigh
            continue
        if cluster is None:
            cluster = (await cache.load(conn))[1], await load_running(conn)
        plan = await _consider(conn, state, tenants[state.job_id], cluster, policy, now, known, fair.get(state.job_id))
        plans.append(plan)
        if plan.outcome == "preempt":
            cluster, preempted = None, True  # victims stopping, GPUs nominated: read again for the next job
    await store.record_evaluations(conn, plans, now)


def _quick(waiting: list[lifecycle.JobState], tenants: dict[str, str],
           running: tuple) -> list[sel.PreemptionPlan | None]:
    """Each job's priority plan when the running jobs' priorities alone decide it (``nobody_to_preempt``)."""
    count, lowest, stopping, _ = running
    return [sel.nobody_to_preempt(_preemptor(state, tenants[state.job_id]), count, lowest, stopping)
            for state in waiting]


async def reconsider(conn: asyncpg.Connection, policy: PreemptionPolicy, now: datetime,
                     tenancies: TenancyStore | None = None, cache: ClusterCache | None = None) -> int:
    """Weigh again the jobs placement deferred that still wait (``stores.cluster.deferred_jobs``), as
    ``consider_all`` does: a job is weighed when placement defers it with new reasons, and nothing else would
    tell this service that the runs protected then (younger than the minimum run time, or than fair share's
    quantum) no longer are. How many were weighed."""
    job_ids = await deferred_jobs(conn)
    if job_ids:
        await consider_all(conn, job_ids, policy, now, tenancies, cache)
    return len(job_ids)


async def _waiting(conn: asyncpg.Connection, job_ids: list[str],
                   tenancies: TenancyStore) -> tuple[list[lifecycle.JobState], dict[str, str]]:
    """Of ``job_ids``, those still queued with no GPUs held for them (their victims are already stopping), and
    the tenant quota charges each to."""
    states = await load_jobs(conn, job_ids)
    waiting = [states[job_id] for job_id in job_ids
               if states[job_id].status is lifecycle.JobStatus.QUEUED and states[job_id].spec is not None]
    held = await nominated(conn, [state.job_id for state in waiting])
    waiting = [state for state in waiting if state.job_id not in held]
    if not waiting:
        return [], {}
    specs = {state.job_id: state.spec for state in waiting if state.spec is not None}
    return waiting, await store.charged_tenants(conn, {job_id: spec.tenant for job_id, spec in specs.items()},
                                                tenancies)


def _preemptor(state: lifecycle.JobState, tenant: str) -> sel.Preemptor:
    assert state.spec is not None
    return sel.Preemptor(state.job_id, tenant, state.spec.priority, request_of(state.job_id, state.spec))


async def _consider(conn: asyncpg.Connection, state: lifecycle.JobState, tenant: str,
                    cluster: tuple[engine.ClusterSnapshot, list], policy: PreemptionPolicy, now: datetime,
                    known: sel.PreemptionPlan | None = None,
                    fair: tuple[sel.FairShareTrigger, int] | None = None) -> sel.PreemptionPlan:
    """One deferred job (charged to ``tenant``, as quota compares) against the cluster read for it: the plan,
    carried out when it preempts. ``known``: its priority plan when decided already (``_quick``); ``fair``:
    the fair-share trigger and the quota units the job holds, weighed when no priority preemption helps."""
    snapshot, running = cluster
    preemptor = _preemptor(state, tenant)
    plan = known or sel.select_victims(snapshot, preemptor, running, now.timestamp(), config=policy.config)
    if plan.outcome == "none" and fair is not None:
        trigger, units = fair
        preemptor = replace(preemptor, units=units)
        by_share = sel.select_victims(snapshot, preemptor, running, now.timestamp(), trigger=trigger,
                                      config=fair_config(policy))
        plan = by_share if by_share.outcome != "none" else plan
    if plan.outcome == "preempt":
        assert plan.placement is not None
        stopped = await store.stop_victims(conn, preemptor, plan.victims, policy, now)
        await nominate(conn, state.job_id, plan.placement, now)
        reason = "; ".join(plan.reasons) or f"preempting {', '.join(plan.victim_ids)}"
        await _victims_selected(conn, state, plan, stopped, reason, now)
    return plan


async def reclaim(conn: asyncpg.Connection, request: ev.ReclaimRequested, policy: PreemptionPolicy, now: datetime,
                  tenancies: TenancyStore | None = None) -> sel.PreemptionPlan | None:
    """Answer one reclaim request: quota asks to return borrowed capacity of one flavor to a tenant under its
    nominal quota. For the request's first blocked job, let the selection core choose victims among the
    borrowers (``plan_reclaim``) on the cluster as placement sees it, stop them as a priority preemption
    does, hold the freed GPUs for the blocked job, and remember the victims so that a repeated request
    counts what is already being given back. Returns the plan (None when its job no longer waits)."""
    await lock_cycle(conn)
    state = await _blocked_job(conn, request, tenancies or TenancyStore())
    if state is None or state.spec is None:
        return None
    ask = reclaim_ask(request)
    preemptor = sel.Preemptor(state.job_id, request.tenant, state.spec.priority,
                              request_of(state.job_id, state.spec, ask.flavor), quota_units_of(state.spec, ask.flavor))
    freed = await store.load_freed(conn, state.job_id)
    running = await load_running(conn)
    plan = sel.plan_reclaim(await _cluster_for(conn, state.job_id), preemptor, ask, running, freed, now.timestamp(),
                            quota_reserved=state.status is lifecycle.JobStatus.QUEUED, config=policy.config)
    await store.record_evaluation(conn, plan, now)
    log.info("reclaim for job %s of tenant %s: %s", state.job_id, request.tenant, plan.reasons[1])
    await store.forget_accounted(conn, state.job_id, freed, ask.requested_at_s)
    if plan.outcome == "preempt":
        stopped = await store.stop_victims(conn, preemptor, plan.victims, policy, now)
        await store.remember(conn, state.job_id, ask.flavor, stopped, {job.job_id: job.units for job in running}, now)
        await nominate(conn, state.job_id, plan.placement, now)
        if state.status is lifecycle.JobStatus.QUEUED:  # its stream can say why (an Admitted one has no command)
            await _victims_selected(conn, state, plan, stopped, "; ".join(plan.reasons), now)
    return plan


async def _blocked_job(conn: asyncpg.Connection, request: ev.ReclaimRequested,
                       tenancies: TenancyStore) -> lifecycle.JobState | None:
    """The request's first job, while it still waits and is charged to the tenant the request is for."""
    if not request.for_jobs:
        log.info("reclaim for tenant %s names no blocked job; nothing to do", request.tenant)
        return None
    job_id = request.for_jobs[0]
    state = await load_job(conn, job_id)
    charged = await store.charged_tenant(conn, job_id, state.spec.tenant, tenancies) if state.spec else None
    if state.spec is None or state.status not in WAITING or charged != request.tenant:
        log.info("reclaim for job %s of tenant %s: nothing to do, the job is %s%s", job_id, request.tenant,
                 state.status.value if state.status else "unknown",
                 f" and charged to {charged}" if charged not in (None, request.tenant) else "")
        return None
    return state


async def _cluster_for(conn: asyncpg.Connection, job_id: str) -> engine.ClusterSnapshot:
    """The cluster as placement sees it, with the GPUs already held for ``job_id`` counted as its own."""
    _, snapshot = await load_cluster(conn)
    held = engine.RequestId(nomination_id(job_id))
    return engine.release(snapshot, held) if held in snapshot.allocations else snapshot


async def _victims_selected(conn: asyncpg.Connection, state: lifecycle.JobState, plan: sel.PreemptionPlan,
                            stopped: list[store.Stopped], reason: str, now: datetime) -> None:
    """Record the decision on the preemptor's stream: its victims and the nodes told to stop them."""
    node_ids = tuple(sorted({node for s in stopped for node in s.node_ids}))
    command = lifecycle.SelectVictims(plan.victim_ids, node_ids, reason)
    await append_job_events(conn, state, lifecycle.decide(state, command, now), producer=SERVICE, now=now)
