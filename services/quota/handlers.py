"""Quota's handlers: job events (cohorts, borrowing, fair share and reclaims; ``gpusched_core.quota``) and an
operator's ``TenancyUpdated`` (put in force with its limits and a cycle for every cohort, or rejected with
every reason, recorded and logged; ``core.review_update``; a bad update never stops the service).

Per batch, each touched cohort gets one reservation cycle (``reserve_for_cohort``): lock the cohort's usage
rows, build a ``QuotaSnapshot``, ``plan_cycle``, append ``QuotaReserved`` / ``QuotaDeferred``, charge the
rows, and put the reclaim requests the plan needs in the outbox (``ReclaimRequested``). Releases lock the
same rows first. Two quota processes therefore decide one cohort in turn, and the ``quota_policy_usage``
CHECK refuses any charge above ``nominal + borrowing_limit`` should that ever fail.

A batch's releases (ends, preemptions, holds) are given back together at its end (``release_many``: a few
statements for all of them, not a dozen per job), before its cycles: the jobs waiting for those that
ended are judged first, then every touched cohort's rows are locked in one statement, in (tenant, flavor)
order. A cycle may then lock another cohort; should two replicas cross that way, PostgreSQL aborts one
and the batch is replayed message by message (one cohort per transaction), which cannot deadlock.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import chain

import asyncpg

from gpusched_core import lifecycle
from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.credentials import TenantKey, verify
from gpusched_core.lifecycle import JobStatus
from gpusched_common.jobs import append_many_job_events, load_job, load_jobs, stored_payload
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.store import claim, enqueue
from gpusched_common.topics import QUOTA_RECLAIMS
from gpusched_common.tracing import current_traceparent

from services.quota import store, waits
from gpusched_common.pacing import CyclePacer
from services.quota.charges import advance_histories, release_many
from gpusched_core.quota import (
    UNITS_PER_GPU,
    BlockedWork,
    PendingJob,
    QuotaPlan,
    QuotaSnapshot,
    Reservation,
    Tenancy,
    plan_cycle,
)
from gpusched_core.arrays import held_back
from gpusched_core.quota.reclaims import reclaim_event, select_reclaims
from gpusched_common.stores import quota as reads
from gpusched_common.stores.tenancy import TenancyStore
from gpusched_common.senders import RefusalCounts
from services.quota.core import Accepted, review_update
from gpusched_core.quota.fairness import DEFAULT_FAIR_PREEMPTION_MARGIN
from gpusched_core.quota.reasons import worth_recording
from gpusched_core.quota.jobs import (
    QueuedJob,
    as_guest,
    cap_units,
    chargeable,
    cohort_members,
    cohort_of,
    queued_job,
)

log = logging.getLogger(__name__)
SERVICE = "quota"
_TERMINAL = (ev.JobSucceeded, ev.JobFailed, ev.JobCancelled)
_ENDED = (*_TERMINAL, ev.JobRejected)  # a job others may wait for ended
# the job events quota claims (as ``topics.INBOX_READERS`` says: the relay counts on it); it passes over the rest
CLAIMED_JOB_EVENTS = (ev.JobAdmitted, ev.JobPreempted, ev.JobHeld, ev.JobReleased, *_ENDED)


@dataclass(frozen=True)
class CycleOptions:
    reclaim_cooldown_s: float = 300.0  # a reclaim still needed is asked for again after this long
    # fair backfill (``gpusched_core.quota.backfill``): while a reserved job waits for room on the nodes, no
    # other tenant of its cohort is reserved past (1 + margin) x its tenant's share; None: off
    fair_margin: float | None = DEFAULT_FAIR_PREEMPTION_MARGIN


def make_job_event_handler(tenancies: TenancyStore, clock: Callable[[], datetime],
                                  options: CycleOptions = CycleOptions(), pacer: CyclePacer | None = None) -> TxHandler:
    """``pacer``: when a batch runs its cohorts' cycles itself and when it leaves them due later (``pacing``);
    None: every batch runs them (a pacer whose cycles may take all the time)."""
    pacer = pacer or CyclePacer(share=1.0)

    async def on_job_event(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, CLAIMED_JOB_EVENTS):
            return
        payload = await stored_payload(conn, envelope)  # the store's event, or none at all
        if payload is None or not await claim(conn, SERVICE, envelope.event_id):
            return
        tenancy = await _tenancy_of(batch, conn, tenancies)
        now = clock()
        cycles = _Cycles(batch, tenancies, clock, options, pacer)
        if not isinstance(payload, ev.JobAdmitted | ev.JobReleased):
            cycles.release_later(payload.job_id, requeue=isinstance(payload, ev.JobPreempted),
                                 ended=isinstance(payload, _ENDED))
            return
        if payload.job_id in batch.memo.get(_RELEASES, {}):  # type: ignore[operator]
            await cycles.flush_releases(conn)  # held and released in one batch: given back before it queues
        state = await load_job(conn, payload.job_id)  # the store decides, not the payload
        if state.spec is None or state.submitted_at is None or state.status is not lifecycle.JobStatus.ADMITTED:
            return  # admitted held (its JobHeld follows): it waits for its release, not for quota
        if not await waits.ready_to_queue(conn, state, now):
            return  # it waits for other jobs to end (or never runs)
        _queue(batch, state)
        cycles.reserve_later(tenancy, state.spec.tenant)

    return on_job_event


_RELEASES = "releases"  # batch memo: the jobs whose quota the batch gives back at its end, and whether to requeue
_ENDS = "ends"  # batch memo: the jobs that ended in the batch (those waiting for them are judged again)


@dataclass(frozen=True)
class _Cycles:
    """A batch's deferred quota work: releases first (key "release"), then one cycle per touched cohort."""
    batch: Batch
    tenancies: TenancyStore
    clock: Callable[[], datetime]
    options: CycleOptions
    pacer: CyclePacer

    def reserve_later(self, tenancy: Tenancy, tenant: str) -> None:
        cohort = cohort_of(tenancy, tenant)

        async def reserve(conn: asyncpg.Connection) -> None:
            await flush_queue(conn, self.batch)

            async def cycle() -> None:
                tenancy_now = await _tenancy_of(self.batch, conn, self.tenancies)
                await reserve_for_cohort(conn, tenancy_now, cohort, self.clock(), self.options)

            await self.pacer.run_or_defer(cohort, self.batch, cycle)  # paced: one cycle later takes them all

        self.batch.after(f"reserve:{cohort}", reserve)  # one cycle per cohort per batch

    def release_later(self, job_id: str, *, requeue: bool, ended: bool) -> None:
        """Give the job's quota back with the batch's other releases (the last message about it decides
        whether it queues again: a preempted job does, to resume later); after an end, the jobs waiting for
        it are judged first (they may go in line now, or never)."""
        releases: dict[str, bool] = self.batch.memo.setdefault(_RELEASES, {})  # type: ignore[assignment]
        releases[job_id] = requeue
        if ended:
            ends: dict[str, None] = self.batch.memo.setdefault(_ENDS, {})  # type: ignore[assignment]
            ends[job_id] = None
        self.batch.after("release", self.flush_releases)  # sorts before "reserve:...": freed units are offered

    async def flush_releases(self, conn: asyncpg.Connection) -> None:
        releases: dict[str, bool] = self.batch.memo.pop(_RELEASES, {})  # type: ignore[assignment]
        ends: dict[str, None] = self.batch.memo.pop(_ENDS, {})  # type: ignore[assignment]
        if not releases:
            return
        tenancy = await _tenancy_of(self.batch, conn, self.tenancies)
        now = self.clock()
        for ready in await waits.ready_dependants(conn, list(ends), now):
            _queue(self.batch, ready)
            self.reserve_later(tenancy, ready.spec.tenant)  # type: ignore[union-attr]  # ready: has a spec
        await flush_queue(conn, self.batch)  # the line as the batch left it, before jobs leave it
        released = await release_many(conn, tenancy, list(releases), now)
        await store.queue_jobs(conn, [(queued_job(j, s.spec, now.timestamp()), s.spec.array)
                                      for j, (_, s) in released.items()  # a preempted job, not ended since
                                      if releases[j] and s.status is JobStatus.ADMITTED and s.spec is not None])
        for tenant in sorted({tenant for tenant, _ in released.values()}):
            self.reserve_later(tenancy, tenant)


async def _tenancy_of(batch: Batch, conn: asyncpg.Connection, tenancies: TenancyStore) -> Tenancy:
    """The tenancy in force, read once per batch: its transaction holds the tenancy lock shared from the
    first read on, so no new revision lands before it commits."""
    if "tenancy" not in batch.memo:
        batch.memo["tenancy"] = await tenancies.current(conn)
    return batch.memo["tenancy"]  # type: ignore[return-value]


def _queue(batch: Batch, state: lifecycle.JobState) -> None:
    """In quota's line at its submission time (also when released after a hold, or after its dependencies):
    written with the batch's others (``flush_queue``) before its cohort's cycle, or before a release."""
    assert state.spec is not None and state.submitted_at is not None
    queued: list = batch.memo.setdefault("queue", [])  # type: ignore[assignment]
    queued.append((queued_job(state.job_id, state.spec, state.submitted_at.timestamp()), state.spec.array))


async def flush_queue(conn: asyncpg.Connection, batch: Batch) -> None:
    await store.queue_jobs(conn, batch.memo.pop("queue", []))  # type: ignore[arg-type]


async def reserve_for_cohort(conn: asyncpg.Connection, tenancy: Tenancy, cohort: str, now: datetime,
                             options: CycleOptions = CycleOptions()) -> QuotaPlan | None:
    """One reservation cycle for a cohort, inside the caller's transaction; the plan (None: nothing waits)."""
    members = cohort_members(tenancy, cohort)
    usage = await store.lock_usage(conn, tenancy, members)  # FOR UPDATE: one decider per cohort at a time
    jobs = {job.job_id: job for job in await reads.load_cohort_queue(conn, tenancy, cohort)}
    if not jobs:
        return None
    capped = await _held_by_array_caps(conn, members)
    await _defer(conn, [(job_id, reason) for job_id, reason in capped.items()
                        if job_id in jobs and _worth_recording(jobs[job_id], reason, now)], now)
    offered = [job for job in jobs.values() if job.job_id not in capped]
    if not offered:
        return None
    pending, unchargeable = chargeable(tenancy, offered)
    history = await reads.load_history(conn, members)
    blocked = await _blocked_work(conn, tenancy, members, pending) if options.fair_margin is not None else ()
    plan = plan_cycle(QuotaSnapshot(tenancy, usage, history, now.timestamp()), pending, blocked=blocked,
                      fair_margin=options.fair_margin)
    held = {tenant: dict(per_flavor) for tenant, per_flavor in usage.items()}  # the snapshot stays as planned
    await _reserve(conn, tenancy, plan.reservations, held, now)
    # reasons only (unordered): a reader ranks the queue itself (``gpusched_common.stores.quota.quota_queue``)
    changed = []
    for job_id, reason in chain(((job.job_id, reason) for job, _, reason in plan.reasons()), unchargeable):
        reason = as_guest(tenancy, jobs[job_id], reason)
        if _worth_recording(jobs[job_id], reason, now):
            changed.append((job_id, reason))
    await _defer(conn, changed, now)
    await _send_reclaims(conn, tenancy, cohort, plan, now, options.reclaim_cooldown_s)
    return plan


async def _blocked_work(conn: asyncpg.Connection, tenancy: Tenancy, members: tuple[str, ...],
                        pending: list[PendingJob]) -> list[BlockedWork]:
    """The cohort's reserved work waiting for room that could hold back a job of this cycle: none to read when
    every job waiting is of one tenant and nobody else is in the cohort (a tenant's own work never holds it
    back), else that of the members other than such a lone tenant."""
    waiting = {job.tenant for job in pending}
    others = tuple(m for m in members if len(waiting) > 1 or m not in waiting)
    return await reads.blocked_work(conn, tenancy, others) if others and waiting else []


def _worth_recording(job: QueuedJob, reason: str, now: datetime) -> bool:
    return worth_recording(job.last_reason, job.last_reason_at_s, reason, now.timestamp())


async def _held_by_array_caps(conn: asyncpg.Connection, members: tuple[str, ...]) -> dict[str, str]:
    """The waiting array tasks their array's cap keeps out of this cycle, with the reason."""
    tasks = await store.capped_tasks(conn, members)
    if not tasks:
        return {}
    return held_back(tasks, await store.active_tasks(conn, sorted({t.array_id for t in tasks})))


async def reserve_everywhere(conn: asyncpg.Connection, tenancy: Tenancy, now: datetime,
                             options: CycleOptions = CycleOptions()) -> int:
    """A cycle for every cohort with waiting work, inside the caller's transaction; how many ran."""
    cohorts = sorted({cohort_of(tenancy, t) for t in await reads.queued_tenants(conn)})
    for cohort in cohorts:
        await reserve_for_cohort(conn, tenancy, cohort, now, options)
    return len(cohorts)


async def reconcile(pool: asyncpg.Pool, tenancies: TenancyStore, now: datetime, options: CycleOptions) -> int:
    """A cycle for every cohort with waiting work, one transaction each, from the store alone (a lost or
    delayed message never strands a job; a reclaim still needed is asked for again); how many ran."""
    async with pool.acquire() as conn:
        async with conn.transaction():
            tenancy = await tenancies.current(conn)
            cohorts = sorted({cohort_of(tenancy, t) for t in await reads.queued_tenants(conn)})
        for cohort in cohorts:
            async with conn.transaction():
                await reserve_for_cohort(conn, await tenancies.current(conn), cohort, now, options)
    return len(cohorts)


async def _reserve(conn: asyncpg.Connection, tenancy: Tenancy, reservations: tuple[Reservation, ...],
                   usage: dict[str, dict[str, int]], now: datetime) -> None:
    """Charge and record the plan's reservations: a handful of statements for the whole plan, not a few per
    job. ``usage``: the cohort's locked rows as the plan saw them (updated here)."""
    if not reservations:
        return
    states = await load_jobs(conn, [r.job_id for r in reservations])
    taken = [r for r in reservations
             if states[r.job_id].status is JobStatus.ADMITTED and not states[r.job_id].quota_held]
    await store.unqueue_jobs(conn, [r.job_id for r in reservations if r not in taken])  # ended or reserved meanwhile
    if not taken:
        return
    # accrue what each tenant held until now, at the rate it held before this plan's charges
    await advance_histories(conn, tenancy, {r.tenant: usage.get(r.tenant, {}) for r in taken}, now)
    decided = []
    for r in taken:
        held = usage.setdefault(r.tenant, {})
        held[r.flavor] = total = held.get(r.flavor, 0) + r.units
        command = lifecycle.ReserveQuota(total // UNITS_PER_GPU, cap_units(tenancy, r.tenant, r.flavor) // UNITS_PER_GPU,
                                         gpu_model=r.flavor, borrowed_gpus=r.borrowed_units / UNITS_PER_GPU)
        decided.append((states[r.job_id], lifecycle.decide(states[r.job_id], command, now)))
    await store.charge_many(conn, [(r.tenant, r.flavor, r.units) for r in taken],
                            {(r.tenant, r.flavor): usage[r.tenant][r.flavor] for r in taken})
    await append_many_job_events(conn, decided, producer=SERVICE, now=now)
    await store.record_reservations(conn, [(r.job_id, r.tenant, r.flavor, r.units) for r in taken])


DEFER_CHUNK = 500  # jobs whose reasons are recorded together: their streams are read and held at once


async def _defer(conn: asyncpg.Connection, reasons: list[tuple[str, str]], now: datetime) -> None:
    """Record why each of these jobs still waits (``JobQuotaDeferred`` with the reason), in a few statements
    per ``DEFER_CHUNK`` of them (a cycle after a paced pause may have thousands to record); a job no longer
    Admitted leaves the queue instead."""
    for start in range(0, len(reasons), DEFER_CHUNK):
        await _defer_some(conn, reasons[start:start + DEFER_CHUNK], now)


async def _defer_some(conn: asyncpg.Connection, reasons: list[tuple[str, str]], now: datetime) -> None:
    states = await load_jobs(conn, [job_id for job_id, _ in reasons])
    waiting = [(job_id, reason) for job_id, reason in reasons if states[job_id].status is JobStatus.ADMITTED]
    await store.unqueue_jobs(conn, [job_id for job_id, _ in reasons if states[job_id].status is not JobStatus.ADMITTED])
    await append_many_job_events(
        conn, [(states[job_id], lifecycle.decide(states[job_id], lifecycle.DeferQuota(reason), now))
               for job_id, reason in waiting], producer=SERVICE, now=now)
    await store.set_last_reasons(conn, waiting, now.timestamp())


async def _send_reclaims(conn: asyncpg.Connection, tenancy: Tenancy, cohort: str, plan: QuotaPlan, now: datetime,
                         cooldown_s: float) -> None:
    """Publish, through the outbox, the plan's reclaim requests not already asked for (``reclaims``)."""
    if not plan.reclaims:
        return
    sent = await store.load_sent_reclaims(conn, tuple(sorted({r.tenant for r in plan.reclaims})))
    for request in select_reclaims(plan.reclaims, sent, now.timestamp(), cooldown_s):
        used = plan.usage.get(request.tenant, {}).get(request.flavor, 0)
        payload = reclaim_event(request, tenancy, cohort, used, now)
        event_id = str(uuid.uuid4())
        await store.record_reclaim(conn, event_id, payload, request.units)
        envelope = ev.make_envelope(payload, event_id=event_id, stream_id=f"tenant-{request.tenant}", occurred_at=now,
                                    producer=SERVICE, tenant=request.tenant, traceparent=current_traceparent())
        await enqueue(conn, producer=SERVICE, topic=QUOTA_RECLAIMS.name, key=request.tenant, envelopes=[envelope])
        log.info("quota: reclaim requested: %s", payload.reason)


TENANCY_REFUSED = RefusalCounts(SERVICE)  # tenancy updates no operator credential signed


def make_tenancy_update_handler(keys: dict[str, TenantKey] | None, clock: Callable[[], datetime],
                                options: CycleOptions = CycleOptions()) -> TxHandler:
    """``keys``: the credentials to check signatures with (None: none configured, every update refused)."""

    async def on_update(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, update = parse_event(message)
        if not isinstance(update, ev.TenancyUpdated):
            return
        now = clock()
        verdict = verify(keys, message.headers, message.value) if keys is not None else None
        if verdict is None or verdict.tenant is None:  # nobody we know signed it: a counter, no row, no claim
            await TENANCY_REFUSED.record(conn, message.topic, "unauthenticated", "-",
                                         review_update(update, verdict, None).problems[0], now)
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        in_force = await store.lock_revisions(conn)  # exclusive: no decision runs while the tenancy changes
        review = review_update(update, verdict, in_force)
        if not isinstance(review, Accepted):
            await store.record_rejection(conn, event_id=envelope.event_id, revision=update.revision, source=update.source,
                                   problems=review.problems, now=now)
            (log.info if review.stale else log.warning)(
                "quota: tenancy update %s (revision %d) not applied: %s", envelope.event_id, update.revision,
                "; ".join(review.problems))
            return
        await store.install(conn, review.tenancy, update.document, source=update.source or "TenancyUpdated",
                      event_id=envelope.event_id, now=now)
        log.info("quota: tenancy revision %d in force (was %s), %d tenants", review.tenancy.revision, in_force,
                 len(review.tenancy.leaves()))
        await reserve_everywhere(conn, review.tenancy, now, options)

    return on_update
