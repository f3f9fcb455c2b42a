"""Placement's handlers: quota reservations, cancellations and node reports in; placements and node
commands out. Each parses nothing itself (``make_handler`` does), loads what it needs through ``store``,
decides with the pure cores (``gpusched_core.placement``, ``gpusched_core.lifecycle``) and appends the
job's events with the outbox, in the consumer's transaction."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common import node_keys
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, append_many_job_events, load_job, load_jobs, stored_payload
from gpusched_common.ignored import Ignored
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.pacing import CyclePacer
from gpusched_common.store import claim
from gpusched_common.stores.cluster import ClusterCache, current_version, lock_cycle, pending_jobs
from gpusched_common.senders import RefusalCounts
from gpusched_common.topics import JOBS_EVENTS, NODES_REPORTS

from gpusched_core import bulkheads, lifecycle
from gpusched_core import placement as engine
from gpusched_core.placement.cycle import Deferral, Placement, run_plan
from gpusched_core.placement.launch import start_commands
from gpusched_core.placement.leases import is_stale, select_expired
from services.placement import starts, store
from services.placement.ends import on_exited, record_exit, requeue
from services.placement.reservations import defer_reservation, flush_reservations, lock_cycle_once, on_reserved
from services.placement.reports import defer_heartbeat, flush_reports, load_senders, record_start, this_run
from services.placement.store import SERVICE

# the job events placement claims (as ``topics.INBOX_READERS`` says: the relay counts on it)
CLAIMED_JOB_EVENTS = (ev.QuotaReserved, ev.JobCancelled, ev.JobCancelRequested, ev.JobHeld)
log = logging.getLogger(__name__)
CYCLE_KEY = "cluster"  # placement's one cycle over the whole cluster, as its pacer knows it
DEFER_CHUNK = 500  # deferrals a cycle records at once (their job streams read and written together)
INLINE_PLAN_JOBS = 32  # a cycle weighing at most this many jobs plans on the event loop (see ``run_cycle``)
REFUSED = RefusalCounts(SERVICE)  # node reports no enrolled node signed
# messages that may write nodes, GPUs or allocations, or placement's queue: they take the cycle lock first
# (see ClusterCache). A reservation judges its job under it: read outside it, the job could be placed by a
# cycle committing between the read and the queueing, and be queued again while it holds its GPUs
_WRITES_CLUSTER = (ev.JobCancelled, ev.NodeRegistered, ev.GpuHealthChanged, ev.JobExitReported, ev.QuotaReserved)


def make_handler(clock: Callable[[], datetime], policy: engine.PlacementPolicy, cache: ClusterCache, *,
                 keys: node_keys.NodeKeys | None = None, accept_unsigned: bool = False,
                 refusals: RefusalCounts | None = None, pacer: CyclePacer | None = None) -> TxHandler:
    """One handler for job events and node reports: record the effect; cycle once per batch if needed, or,
    when ``pacer`` says the last cycle ended too recently, leave the cycle due (``cycle_after``). A node
    report is believed only when the node it names signed it (``node_keys``; ``accept_unsigned``: unsigned
    ones too, development only); an enrolment is decided from the store and answered."""
    keys = keys if keys is not None else node_keys.NodeKeys()
    refused = refusals if refusals is not None else REFUSED
    pacer = pacer or CyclePacer(share=1.0)

    async def on_message(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if message.topic == NODES_REPORTS.name:
            if isinstance(payload, ev.NodeEnrolmentRequested):
                await on_enrolment(conn, message, payload, clock(), keys, refused)
                return
            await load_senders(conn, keys, batch)
            refusal = await node_keys.check(conn, keys, message, envelope.type, getattr(payload, "node_id", None),
                                            accept_unsigned=accept_unsigned)
            if refusal is not None:
                await refused.record(conn, message.topic, refusal.code, refusal.sender, refusal.detail, clock())
                return
        if message.topic == JOBS_EVENTS.name:
            if not isinstance(payload, CLAIMED_JOB_EVENTS):
                return
            stored = await stored_payload(conn, envelope)  # the store's event, or none at all
            if stored is None:
                return
            payload = stored
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        if isinstance(payload, ev.NodeHeartbeat) and not _out_of_range(payload):
            defer_heartbeat(payload, batch, clock)
            return
        if isinstance(payload, ev.JobStartReported) and not _out_of_range(payload):
            await record_start(conn, payload, batch, clock())
            return
        if isinstance(payload, ev.JobExitReported) and not _out_of_range(payload):
            await lock_cycle_once(conn, batch)  # it gives GPUs back
            if await record_exit(conn, payload, batch, clock()):
                cycle_after(batch, clock, policy, cache, pacer)
            return
        if isinstance(payload, ev.QuotaReserved):
            if await defer_reservation(conn, payload, batch):
                cycle_after(batch, clock, policy, cache, pacer)
            return
        await flush_reservations(conn, batch)  # what follows (a cancel, a hold) may concern a job reserved before it
        await flush_reports(conn, batch)  # what follows may read a job whose start or end is still to be written
        if isinstance(payload, _WRITES_CLUSTER):
            await lock_cycle_once(conn, batch)  # taken once a batch (a batch of reservations: one round trip)
        if await apply(conn, payload, clock(), locked=True):
            cycle_after(batch, clock, policy, cache, pacer)

    return on_message


def cycle_after(batch: Batch, clock: Callable[[], datetime], policy: engine.PlacementPolicy, cache: ClusterCache,
                pacer: CyclePacer) -> None:
    """The batch's placement cycle at its end, or, when the last cycle ended too recently for ``pacer``, due
    once the batch committed (``pacing.run_due`` runs it from the store, over everything queued meanwhile);
    either way the batch's reservations are queued first."""
    async def at_end(conn: asyncpg.Connection) -> None:
        await flush_reservations(conn, batch)
        await pacer.run_or_defer(CYCLE_KEY, batch, lambda: cycle_or_due(
            conn, batch, pacer, lambda: run_cycle(conn, clock(), policy, cache)))

    batch.after("placement-cycle", at_end)


async def cycle_or_due(conn: asyncpg.Connection, batch: Batch, pacer: CyclePacer,
                       cycle: Callable[[], Awaitable[None]]) -> None:
    """The batch's cycle in a savepoint: one that fails (a plan the store refuses, a bug) is rolled back and due
    again shortly, and the batch's messages commit without it. A cycle weighs the whole cluster, so its failure
    is no message's fault: failing the batch would split it down to single messages, each failing the same way,
    and dead-letter its reservations. (A connection that broke fails the batch's commit all the same.)"""
    try:
        async with conn.transaction():
            await cycle()
    except Exception as exc:  # noqa: BLE001 - any failure of the cycle: rolled back, retried by the due loop
        log.warning("placement: a batch's cycle failed (%s); it is due again shortly", exc)
        batch.after_commit("placement-cycle-retry", lambda: pacer.retry(CYCLE_KEY))


async def on_enrolment(conn: asyncpg.Connection, message: Incoming, request: ev.NodeEnrolmentRequested,
                       now: datetime, keys: node_keys.NodeKeys, refused: RefusalCounts) -> None:
    """Enrol a node's key as its join token vouches, and tell the node; a refusal is counted (and told to a
    holder of the token). A resent request of an enrolled key is answered again: enrolment is idempotent."""
    decision = await node_keys.enrol(conn, request, message.headers, message.topic, message.value, now)
    if isinstance(decision, node_keys.Enrol):
        keys.forget(request.key_id)
        if decision.new:
            log.info("node %s enrolled with key %s (join token %s)", request.node_id, request.key_id,
                     request.token_id)
        await store.send_command(conn, ev.NodeEnrolled(node_id=request.node_id, key_id=request.key_id),
                                 request.node_id, now)
        return
    await refused.record(conn, message.topic, "enrolment", "-", f"{request.node_id[:40]}: {decision.reason}", now)
    if decision.answer:
        await store.send_command(conn, ev.NodeEnrolmentRefused(node_id=request.node_id, key_id=request.key_id,
                                                               reason=decision.reason), request.node_id, now)


async def process(conn: asyncpg.Connection, payload: ev.Payload, now: datetime, policy: engine.PlacementPolicy,
                  cache: ClusterCache | None = None) -> None:
    """Apply one message and, when capacity or pending work changed, run a placement cycle (with no
    ``cache``, the cycle loads the cluster from the store)."""
    if await apply(conn, payload, now):
        await run_cycle(conn, now, policy, cache)


async def apply(conn: asyncpg.Connection, payload: ev.Payload, now: datetime, *, locked: bool = False) -> bool:
    """Record one message's effect; True when free capacity or pending work may have changed. What a node
    tells is checked first (``gpusched_core.bulkheads``): an impossible registration quarantines the node,
    a heartbeat or report out of range is ignored and counted (``OUT_OF_RANGE``). ``locked``: the caller holds
    the cycle lock already."""
    refused = _out_of_range(payload)
    if refused:
        if isinstance(payload, ev.NodeRegistered):
            await lock_cycle(conn)
            await store.quarantine_node(conn, payload, refused, now)
            log.warning("placement: node %s quarantined: %s", payload.node_id[:60], "; ".join(refused))
            return True
        OUT_OF_RANGE.note(payload.TYPE, "; ".join(refused))
        return False
    if isinstance(payload, _WRITES_CLUSTER) and not locked:
        await lock_cycle(conn)
    handler = _HANDLERS.get(type(payload))
    return False if handler is None else await handler(conn, payload, now)


async def on_cancelled(conn: asyncpg.Connection, cancelled: ev.JobCancelled, now: datetime) -> bool:
    await store.forget_pending(conn, cancelled.job_id)
    await store.stop_on(conn, cancelled.job_id, await store.release_gpus(conn, cancelled.job_id), cancelled.reason,
                        now)
    return True


async def on_held(conn: asyncpg.Connection, held: ev.JobHeld, now: datetime) -> bool:
    await store.forget_pending(conn, held.job_id)  # quota gives back its reservation; released, it comes again
    return False


async def on_cancel_requested(conn: asyncpg.Connection, asked: ev.JobCancelRequested, now: datetime) -> bool:
    """Tell every node the job runs on to stop it; its GPUs stay held until each reports the process gone
    (``on_exited``: the job then ends Cancelled)."""
    await store.stop_on(conn, asked.job_id, await store.nodes_of(conn, asked.job_id), f"cancelled: {asked.reason}", now)
    return False


async def on_registered(conn: asyncpg.Connection, node: ev.NodeRegistered, now: datetime) -> bool:
    """Record the node's inventory and new lease, then tell the agent which jobs should run there. Under
    the cycle lock, the list holds every placement committed so far, and any later one commits (and so is
    published) after this answer: the agent never sees a StartJob its ReconcileJobs denies.

    Epochs are the store's: a registration at an epoch the node used before (an agent whose directory was
    wiped counts from 1 again) is refused with the lowest epoch accepted now (``NodeLost.next_epoch``), and
    the agent registers again above it, so a fenced run's reports can never pass for the new one's."""
    floor = await store.epoch_floor(conn, node.node_id)
    if floor is not None and not floor.accepts(node.lease_epoch):
        await store.send_command(conn, ev.NodeLost(
            node_id=node.node_id, lease_epoch=node.lease_epoch, next_epoch=floor.next_epoch,
            reason=f"lease epoch {node.lease_epoch} was used by this node before: register at {floor.next_epoch}"),
            node.node_id, now)
        return False
    await store.upsert_node(conn, node, now)
    expected = await store.jobs_on(conn, node.node_id)
    states = [await load_job(conn, job_id) for job_id in expected]
    reconcile = ev.ReconcileJobs(node_id=node.node_id, job_ids=expected, lease_epoch=node.lease_epoch,
                                 attempts={s.job_id: s.runs for s in states})
    await store.send_command(conn, reconcile, node.node_id, now)
    for state in states:  # asked to stop while the agent was away: it stops them now, and reports
        if state.cancel is not None:
            await store.stop_on(conn, state.job_id, [node.node_id], f"cancelled: {state.cancel.reason}", now)
    return True


async def on_heartbeat(conn: asyncpg.Connection, beat: ev.NodeHeartbeat, now: datetime) -> bool:
    await store.record_heartbeat(conn, beat, now)
    return False


async def on_gpu_health(conn: asyncpg.Connection, change: ev.GpuHealthChanged, now: datetime) -> bool:
    if await _stale(conn, change.node_id, change.lease_epoch):
        return False
    await store.set_gpu_health(conn, change.node_id, change.gpu_index, change.healthy)
    return change.healthy  # a GPU back in service may let waiting work run


async def on_started(conn: asyncpg.Connection, report: ev.JobStartReported, now: datetime) -> bool:
    """One start report alone (a batch of node reports records its starts together: ``record_start``)."""
    batch = Batch()
    await record_start(conn, report, batch, now)
    await batch.finish(conn)
    return False


async def on_checkpointed(conn: asyncpg.Connection, report: ev.JobCheckpointReported, now: datetime) -> bool:
    if not await _stale(conn, report.node_id, report.lease_epoch) and await this_run(conn, report):
        command = lifecycle.RecordCheckpoint(report.node_id, report.checkpoint_ref, report.checkpointed_at)
        await _decide(conn, report.job_id, command, now)
    return False


OUT_OF_RANGE = Ignored("node messages with numbers out of range")


def _out_of_range(payload: ev.Payload) -> list[str]:
    if isinstance(payload, ev.NodeRegistered):
        return bulkheads.check_registration(payload)
    if isinstance(payload, ev.NodeHeartbeat):
        return bulkheads.check_heartbeat(payload)
    if isinstance(payload, (ev.JobStartReported, ev.JobExitReported, ev.JobCheckpointReported, ev.GpuHealthChanged)):
        return bulkheads.check_report(payload)
    return []


_HANDLERS = {ev.QuotaReserved: on_reserved, ev.JobCancelled: on_cancelled, ev.JobCancelRequested: on_cancel_requested,
             ev.JobHeld: on_held,
             ev.NodeRegistered: on_registered,
             ev.NodeHeartbeat: on_heartbeat, ev.GpuHealthChanged: on_gpu_health, ev.JobStartReported: on_started,
             ev.JobCheckpointReported: on_checkpointed, ev.JobExitReported: on_exited}


OWN_GAP_S = 5.0  # placement itself did not check leases this long (paused, its database down): not the nodes' fault


async def check_leases(conn: asyncpg.Connection, now: datetime, policy: engine.PlacementPolicy,
                       cache: ClusterCache | None = None, *, away_s: float = 0.0,
                       listening: Callable[[], Awaitable[bool]] | None = None) -> list[str]:
    """Declare silent nodes lost, requeue their jobs once, and place again; returns the nodes lost.
    ``away_s``: how long placement itself was not checking. A lease is judged by the heartbeats placement
    received, so time it was not listening (a pause, an outage of its database) is not the nodes'
    silence: after a gap longer than OWN_GAP_S every node gets a fresh lease first; and ``listening``
    (when given) says whether placement has read the heartbeats waiting for it in the broker: until it
    has, nobody is declared lost (consumer lag is placement not listening, issue 15)."""
    await lock_cycle(conn)
    if away_s > OWN_GAP_S:
        await store.refresh_leases(conn, now)
        log.warning("placement did not check leases for %.0f s; every node gets a fresh lease", away_s)
        return []
    expired = select_expired(await store.leases(conn), now)
    if expired and listening is not None and not await listening():
        return []
    for lease in expired:
        await store.mark_lost(conn, lease.node_id)
        silent_s = (now - lease.last_seen_at).total_seconds()
        await store.send_command(conn, ev.NodeLost(  # told, so an agent that was only slow comes back
            node_id=lease.node_id, lease_epoch=lease.epoch, reason=f"silent for {silent_s:.0f}s"), lease.node_id, now)
        for job_id in await store.jobs_on(conn, lease.node_id):
            await requeue(conn, job_id, lease.node_id,
                          f"requeued: node {lease.node_id} lost its lease (silent for {silent_s:.0f}s)", now)
    if expired:
        await run_cycle(conn, now, policy, cache)
    return [lease.node_id for lease in expired]


async def run_cycle(conn: asyncpg.Connection, now: datetime, policy: engine.PlacementPolicy,
                    cache: ClusterCache | None = None) -> None:
    """Place what waits: load the queue and the cluster under the cycle lock, plan with the engine, commit.
    With no ``cache`` the cluster is loaded from the store. While the cluster stands as this process's last
    cycle left it, only the jobs that came since are weighed (``ClusterCache.queue_weighed``): those it
    deferred find no room still, and a queue of tens of thousands is not read and weighed again for each
    job that comes."""
    cache = cache or ClusterCache()
    await lock_cycle(conn)
    version = await current_version(conn)
    pending, last_reasons = await pending_jobs(conn, unweighed_only=cache.queue_weighed(version))
    if not pending:
        return
    nodes, snapshot = await cache.load(conn, version)
    if stray := [job.job_id for job in pending if engine.RequestId(job.job_id) in snapshot.allocations]:
        # queued while it holds GPUs (placed already): a row the store should not have, which would fail every
        # cycle on the job's allocation; it waits for nothing, so it goes (its stream is the recovery pass's)
        log.warning("placement: %d queued job(s) hold GPUs already (%s); no longer queued", len(stray),
                    ", ".join(stray[:5]))
        await store.forget_pending_many(conn, stray)
        gone = set(stray)
        pending = [job for job in pending if job.job_id not in gone]
    # the plan is pure and may take a while with thousands waiting: in a worker thread, so this process's
    # event loop goes on with heartbeats, lease checks and its relay meanwhile (the cycle lock, held, keeps
    # every other user of ``policy`` out until this cycle commits). A few jobs are planned here at once: a
    # millisecond or two of CPU, where the thread's wait for the GIL beside a busy event loop took tens
    # (1,000 nodes at half load: 43 ms p50 for about 9 jobs)
    if len(pending) <= INLINE_PLAN_JOBS:
        placements, deferrals, after = run_plan(snapshot, pending, policy, nodes)
    else:
        placements, deferrals, after = await asyncio.to_thread(run_plan, snapshot, pending, policy, nodes)
    exact = await commit_placements(conn, placements, now, policy.name)
    await record_deferrals(conn, [d for d in deferrals if last_reasons[d.job_id] != list(d.reasons)], now)
    if exact:
        await cache.keep(conn, nodes, after, weighed=True)
    else:  # a placement the job's stream refused: the store and the plan differ, so load it next time
        cache.forget()


async def record_deferrals(conn: asyncpg.Connection, deferrals: list[Deferral], now: datetime) -> None:
    """Tell each job why it still waits (reasons new since the last time), a few statements for every
    ``DEFER_CHUNK`` jobs: a paced cycle over a backlog may have thousands to tell, whose streams are not read
    and held all at once."""
    for start in range(0, len(deferrals), DEFER_CHUNK):
        chunk = deferrals[start:start + DEFER_CHUNK]
        states = await load_jobs(conn, [d.job_id for d in chunk])
        await append_many_job_events(
            conn, [(states[d.job_id], lifecycle.decide(states[d.job_id], lifecycle.DeferPlacement(d.reasons), now))
                   for d in chunk], producer=SERVICE, now=now)
        await store.set_last_reasons_many(conn, [(d.job_id, d.reasons) for d in chunk])


async def commit_placements(conn: asyncpg.Connection, placements: list[Placement], now: datetime,
                            policy: str) -> bool:
    """Record a cycle's placements, each kind of write one statement for all of them (the jobs' streams, their
    GPUs, their StartJobs and the starts to send again); False when a job's stream refused its placement (it
    was placed or ended meanwhile): the store and the plan then differ."""
    if not placements:
        return True
    states = await load_jobs(conn, [p.job_id for p in placements])
    decided = [(p, states[p.job_id], lifecycle.decide(states[p.job_id], p.command(policy), now)) for p in placements]
    await store.forget_pending_many(conn, [p.job_id for p in placements])
    taken = [(p, state, events) for p, state, events in decided if events]
    if not taken:
        return False
    await store.allocate_many(conn, [p for p, _, _ in taken], now)
    placed = await append_many_job_events(conn, [(state, events) for _, state, events in taken], producer=SERVICE,
                                          now=now)
    hostnames, epochs = await store.hostnames_and_epochs(
        conn, sorted({m.node_id for p, _, _ in taken for m in p.all_members}))
    await starts.forget_jobs(conn, [p.job_id for p, _, _ in taken])  # an earlier run's unanswered starts: never again
    commands = []
    for (p, state, _), after in zip(taken, placed):
        assert state.spec is not None
        # the agent continues the job's trace from the JobPlaced event
        commands += [(start, after.trace_parent) for start in start_commands(
            p, state.spec, attempt=after.runs, checkpoint_ref=state.checkpoint_ref, hostnames=hostnames, epochs=epochs)]
    await store.send_commands(conn, [(start, start.node_id, traceparent) for start, traceparent in commands], now)
    await starts.remember_many(conn, [start for start, _ in commands], now)  # sent again until the run starts
    return len(taken) == len(placements)


async def _decide(conn: asyncpg.Connection, job_id: str, command: lifecycle.Command, now: datetime) -> None:
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, command, now), producer=SERVICE, now=now)


async def _stale(conn: asyncpg.Connection, node_id: str, epoch: int | None) -> bool:
    return is_stale(epoch, await store.lost_epoch(conn, node_id))
