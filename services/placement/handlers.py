"""Placement's Kafka edge: quota reservations, node inventory and job reports in; placements out."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, PoisonMessage
from gpusched_common.store import claim, enqueue
from gpusched_common.topics import JOBS_EVENTS, NODES_COMMANDS
from gpusched_common.tracing import current_traceparent

from services.placement import core
from services.placement.leases import REQUEUE_REASON_CODES, NodeLease, is_stale, select_expired

SERVICE = "placement"
_CYCLE_LOCK = 727_100  # one placer decides at a time, whichever replica holds it


def parse_message(message: Incoming) -> tuple[ev.Envelope, ev.Payload]:
    try:
        envelope = ev.Envelope.model_validate_json(message.value)
        return envelope, ev.parse_payload(envelope)
    except ValueError as exc:
        raise PoisonMessage(f"unreadable message: {exc}") from exc


_JOB_EVENTS = (ev.QuotaReserved, ev.JobCancelled)


def make_handler(clock: Callable[[], datetime]) -> TxHandler:
    """One handler for job events and node reports: record the effect; cycle once per batch if needed."""

    async def on_message(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_message(message)
        if message.topic == JOBS_EVENTS.name and not isinstance(payload, _JOB_EVENTS):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        if await apply(conn, payload, clock()):
            batch.after("placement-cycle", lambda c: run_cycle(c, clock()))

    return on_message


async def process(conn: asyncpg.Connection, payload: ev.Payload, now: datetime) -> None:
    """Apply one message and, when capacity or pending work changed, run a placement cycle."""
    if await apply(conn, payload, now):
        await run_cycle(conn, now)


async def apply(conn: asyncpg.Connection, payload: ev.Payload, now: datetime) -> bool:
    """Record one message's effect; True when free capacity or pending work may have changed."""
    match payload:
        case ev.QuotaReserved():
            await conn.execute(
                "INSERT INTO placement_pending (job_id, tenant, gpus, gpu_model, priority)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                payload.job_id, payload.tenant, payload.spec.gpus, payload.spec.gpu_model, payload.spec.priority)
            return True
        case ev.JobCancelled():
            await conn.execute("DELETE FROM placement_pending WHERE job_id = $1", payload.job_id)
            await conn.execute("DELETE FROM gpu_nominations WHERE job_id = $1", payload.job_id)
            await release_gpus(conn, payload.job_id, now, stop_reason=payload.reason)
            return True
        case ev.NodeRegistered():
            await upsert_node(conn, payload, now)
            return True
        case ev.NodeHeartbeat():
            await conn.execute(
                "UPDATE nodes SET last_seen_at = $2, lease_epoch = $3, lease_ttl_s = $4, fence_grace_s = $5"
                " WHERE node_id = $1 AND (lost_epoch IS NULL OR lost_epoch < $3)",
                payload.node_id, now, payload.lease_epoch, payload.lease_ttl_s, payload.fence_grace_s)
            return False
        case ev.GpuHealthChanged():
            if await _stale(conn, payload.node_id, payload.lease_epoch):
                return False
            await conn.execute("UPDATE gpus SET healthy = $3 WHERE node_id = $1 AND gpu_index = $2",
                               payload.node_id, payload.gpu_index, payload.healthy)
            return payload.healthy  # a GPU back in service may let waiting work run
        case ev.JobStartReported():
            if await _stale(conn, payload.node_id, payload.lease_epoch):
                return False
            state = await load_job(conn, payload.job_id)
            command = decider.RecordStart(payload.node_id, payload.pid, payload.started_at)
            await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
            return False
        case ev.JobExitReported():
            return await record_exit(conn, payload, now)
        case ev.JobCheckpointReported():
            if await _stale(conn, payload.node_id, payload.lease_epoch):
                return False
            state = await load_job(conn, payload.job_id)
            command = decider.RecordCheckpoint(payload.node_id, payload.checkpoint_ref, payload.checkpointed_at)
            await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
            return False
    return False


async def record_exit(conn: asyncpg.Connection, report: ev.JobExitReported, now: datetime) -> bool:
    if await _stale(conn, report.node_id, report.lease_epoch):
        return False  # the node was declared lost at this epoch and its jobs were requeued already
    if report.reason_code in REQUEUE_REASON_CODES:
        reason = f"requeued from {report.node_id}: {REQUEUE_REASON_CODES[report.reason_code]}"
        return await requeue(conn, report.job_id, report.node_id, reason, now)
    state = await load_job(conn, report.job_id)
    command = decider.RecordExit(report.node_id, report.exit_code, report.runtime_s, report.error)
    events = decider.decide(state, command, now)
    await append_job_events(conn, state, events, producer=SERVICE, now=now)
    if events:
        await release_gpus(conn, report.job_id, now)
    return bool(events)


async def _stale(conn: asyncpg.Connection, node_id: str, epoch: int | None) -> bool:
    lost_epoch = await conn.fetchval("SELECT lost_epoch FROM nodes WHERE node_id = $1", node_id)
    return is_stale(epoch, lost_epoch)


async def requeue(conn: asyncpg.Connection, job_id: str, node_id: str, reason: str, now: datetime) -> bool:
    """Take a job off a node through no fault of its own and queue it for placement again."""
    state = await load_job(conn, job_id)
    events = decider.decide(state, decider.Requeue(node_id, reason), now)
    if not events:
        return False
    await append_job_events(conn, state, events, producer=SERVICE, now=now)
    await conn.execute("DELETE FROM gpu_allocations WHERE job_id = $1", job_id)
    spec = state.spec
    assert spec is not None
    await conn.execute(
        "INSERT INTO placement_pending (job_id, tenant, gpus, gpu_model, priority) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT DO NOTHING", job_id, spec.tenant, spec.gpus, spec.gpu_model, spec.priority)
    return True


async def check_leases(conn: asyncpg.Connection, now: datetime) -> list[str]:
    """Declare silent nodes lost, requeue their jobs once, and place again; returns the nodes lost."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", _CYCLE_LOCK)
    rows = await conn.fetch(
        "SELECT node_id, lease_epoch, last_seen_at, lease_ttl_s, fence_grace_s, status FROM nodes")
    leases = [NodeLease(r["node_id"], r["lease_epoch"], r["last_seen_at"], r["lease_ttl_s"], r["fence_grace_s"],
                        r["status"] == "Lost") for r in rows]
    expired = select_expired(leases, now)
    for lease in expired:
        await conn.execute("UPDATE nodes SET status = 'Lost', lost_epoch = lease_epoch WHERE node_id = $1",
                           lease.node_id)
        silent_s = (now - lease.last_seen_at).total_seconds()
        jobs = await conn.fetch("SELECT DISTINCT job_id FROM gpu_allocations WHERE node_id = $1 ORDER BY job_id",
                                lease.node_id)
        for row in jobs:
            await requeue(conn, row["job_id"], lease.node_id,
                          f"requeued: node {lease.node_id} lost its lease (silent for {silent_s:.0f}s)", now)
    if expired:
        await run_cycle(conn, now)
    return [lease.node_id for lease in expired]


async def upsert_node(conn: asyncpg.Connection, node: ev.NodeRegistered, now: datetime) -> None:
    """Record the node's inventory and new lease, then tell the agent which jobs should run there."""
    await conn.execute(
        "INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend, registered_at,"
        " last_seen_at, lease_epoch) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8) ON CONFLICT (node_id) DO UPDATE"
        " SET hostname = EXCLUDED.hostname, labels = EXCLUDED.labels, cpu_milli = EXCLUDED.cpu_milli,"
        " memory_mib = EXCLUDED.memory_mib, nvml_backend = EXCLUDED.nvml_backend,"
        " last_seen_at = EXCLUDED.last_seen_at, lease_epoch = EXCLUDED.lease_epoch, status = 'Ready'",
        node.node_id, node.hostname, node.labels, node.cpu_milli, node.memory_mib, node.nvml_backend, now,
        node.lease_epoch)
    await conn.executemany(
        "INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib, healthy) VALUES ($1, $2, $3, $4, $5, $6)"
        " ON CONFLICT (node_id, gpu_index) DO UPDATE SET uuid = EXCLUDED.uuid, model = EXCLUDED.model,"
        " memory_mib = EXCLUDED.memory_mib, healthy = EXCLUDED.healthy",
        [(node.node_id, g.index, g.uuid, g.model, g.memory_mib, g.healthy) for g in node.gpus])
    # Under the cycle lock, the list holds every placement committed so far, and any later one commits
    # (and so is published) after this answer: the agent never sees a StartJob its ReconcileJobs denies.
    await conn.execute("SELECT pg_advisory_xact_lock($1)", _CYCLE_LOCK)
    assigned = await conn.fetch("SELECT DISTINCT job_id FROM gpu_allocations WHERE node_id = $1 ORDER BY job_id",
                                node.node_id)
    reconcile = ev.ReconcileJobs(node_id=node.node_id, job_ids=[r["job_id"] for r in assigned],
                                 lease_epoch=node.lease_epoch)
    await _command(conn, reconcile, node.node_id, now)


async def release_gpus(conn: asyncpg.Connection, job_id: str, now: datetime, stop_reason: str | None = None) -> None:
    rows = await conn.fetch("DELETE FROM gpu_allocations WHERE job_id = $1 RETURNING node_id", job_id)
    if stop_reason is not None:
        for node_id in sorted({r["node_id"] for r in rows}):
            await _command(conn, ev.StopJob(job_id=job_id, node_id=node_id, reason=stop_reason), node_id, now)


async def load_snapshot(conn: asyncpg.Connection) -> core.Snapshot:
    rows = await conn.fetch(
        "SELECT g.node_id, g.gpu_index, g.uuid, g.model, g.healthy, a.job_id, m.job_id AS nominee FROM gpus g"
        " JOIN nodes n ON n.node_id = g.node_id AND n.status = 'Ready'"  # a lost node takes no new work
        " LEFT JOIN gpu_allocations a ON a.node_id = g.node_id AND a.gpu_index = g.gpu_index"
        " LEFT JOIN gpu_nominations m ON m.node_id = g.node_id AND m.gpu_index = g.gpu_index"
        " ORDER BY g.node_id, g.gpu_index")
    nodes: dict[str, list[core.Gpu]] = {}
    for r in rows:
        nodes.setdefault(r["node_id"], []).append(
            core.Gpu(r["gpu_index"], r["uuid"], r["model"], r["healthy"], r["job_id"], r["nominee"]))
    return core.Snapshot(tuple(core.Node(node_id, tuple(gpus)) for node_id, gpus in nodes.items()))


async def run_cycle(conn: asyncpg.Connection, now: datetime) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock($1)", _CYCLE_LOCK)
    rows = await conn.fetch("SELECT job_id, gpus, gpu_model, priority, seq, last_reasons FROM placement_pending")
    if not rows:
        return
    pending = [core.PendingJob(r["job_id"], r["gpus"], r["gpu_model"], r["priority"], r["seq"]) for r in rows]
    last_reasons = {r["job_id"]: r["last_reasons"] for r in rows}
    placements, deferrals = core.plan_cycle(await load_snapshot(conn), pending)
    for placement in placements:
        await commit_placement(conn, placement, now)
    for deferral in deferrals:
        if last_reasons[deferral.job_id] == list(deferral.reasons):
            continue
        state = await load_job(conn, deferral.job_id)
        await append_job_events(conn, state, decider.decide(state, decider.DeferPlacement(deferral.reasons), now),
                                producer=SERVICE, now=now)
        await conn.execute("UPDATE placement_pending SET last_reasons = $2 WHERE job_id = $1", deferral.job_id,
                           list(deferral.reasons))


async def commit_placement(conn: asyncpg.Connection, placement: core.Placement, now: datetime) -> None:
    state = await load_job(conn, placement.job_id)
    command = decider.Place(placement.node_id, placement.gpu_indices, placement.gpu_uuids, placement.gpu_model,
                            core.POLICY, placement.reason)
    events = decider.decide(state, command, now)
    await conn.execute("DELETE FROM placement_pending WHERE job_id = $1", placement.job_id)
    await conn.execute("DELETE FROM gpu_nominations WHERE job_id = $1", placement.job_id)
    if not events:
        return
    # the primary key on (node_id, gpu_index) makes a double allocation fail the whole transaction
    await conn.executemany(
        "INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at) VALUES ($1, $2, $3, $4)",
        [(placement.node_id, i, placement.job_id, now) for i in placement.gpu_indices])
    placed = await append_job_events(conn, state, events, producer=SERVICE, now=now)
    spec = state.spec
    assert spec is not None
    start = ev.StartJob(job_id=placement.job_id, node_id=placement.node_id, tenant=spec.tenant,
                        gpu_indices=list(placement.gpu_indices), gpu_uuids=list(placement.gpu_uuids),
                        command=spec.command, env=resume_env(state))
    # the agent continues the job's trace from the JobPlaced event
    await _command(conn, start, placement.node_id, now, traceparent=placed.trace_parent)


def resume_env(state: decider.JobState) -> dict[str, str]:
    """The job's environment; a job resuming after a preemption learns its last checkpoint."""
    assert state.spec is not None
    if state.checkpoint_ref is None:
        return dict(state.spec.env)
    return {**state.spec.env, "GPUSCHED_RESUME_FROM": state.checkpoint_ref}


async def _command(conn: asyncpg.Connection, payload: ev.Payload, node_id: str, now: datetime,
                   traceparent: str | None = None) -> None:
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{node_id}", occurred_at=now,
                                producer=SERVICE, traceparent=traceparent or current_traceparent())
    await enqueue(conn, producer=SERVICE, topic=NODES_COMMANDS.name, key=node_id, envelopes=[envelope])
