"""Placement's Kafka edge: quota reservations, node inventory and job reports in; placements out."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.resources import canonical_model
from gpusched_common.store import claim
from gpusched_common.topics import JOBS_EVENTS

from gpusched_core import placement as engine
from services.placement.leases import REQUEUE_REASON_CODES, NodeLease, is_stale, select_expired
from services.placement.placing import SERVICE, lock_cycle, run_cycle, send_command


_JOB_EVENTS = (ev.QuotaReserved, ev.JobCancelled)


def make_handler(clock: Callable[[], datetime], policy: engine.PlacementPolicy) -> TxHandler:
    """One handler for job events and node reports: record the effect; cycle once per batch if needed."""

    async def on_message(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if message.topic == JOBS_EVENTS.name and not isinstance(payload, _JOB_EVENTS):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        if await apply(conn, payload, clock()):
            batch.after("placement-cycle", lambda c: run_cycle(c, clock(), policy))

    return on_message


async def process(conn: asyncpg.Connection, payload: ev.Payload, now: datetime,
                  policy: engine.PlacementPolicy) -> None:
    """Apply one message and, when capacity or pending work changed, run a placement cycle."""
    if await apply(conn, payload, now):
        await run_cycle(conn, now, policy)


# messages that may write nodes, GPUs or allocations: they take the cycle lock first (see ClusterCache)
_WRITES_CLUSTER = (ev.JobCancelled, ev.NodeRegistered, ev.GpuHealthChanged, ev.JobExitReported)


async def apply(conn: asyncpg.Connection, payload: ev.Payload, now: datetime) -> bool:
    """Record one message's effect; True when free capacity or pending work may have changed."""
    if isinstance(payload, _WRITES_CLUSTER):
        await lock_cycle(conn)
    match payload:
        case ev.QuotaReserved():
            await queue_for_placement(conn, payload.job_id, bound_to_charge(payload.spec, payload.gpu_model))
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
    if not events:
        return False
    if isinstance(events[0], ev.GangMemberExited):  # the rest of the gang runs on; this node's GPUs are free
        await conn.execute("DELETE FROM gpu_allocations WHERE job_id = $1 AND node_id = $2", report.job_id,
                           report.node_id)
        return True
    # a gang that failed on one node: stop the members still running elsewhere
    others = [n for n in state.node_ids if n != report.node_id and n not in state.exited_nodes]
    await release_gpus(conn, report.job_id, now)
    for node_id in others:
        reason = f"gang member on {report.node_id} ended the job"
        await send_command(conn, ev.StopJob(job_id=report.job_id, node_id=node_id, reason=reason), node_id, now)
    return True


async def queue_for_placement(conn: asyncpg.Connection, job_id: str, spec: ev.JobSpec) -> None:
    share = spec.gpu_share
    await conn.execute(
        "INSERT INTO placement_pending (job_id, tenant, gpus, gpu_model, priority, submitted_at, nodes, share_milli,"
        " share_memory_mib, mig_profile, cpu_milli, memory_mib) VALUES ($1, $2, $3, $4, $5,"
        " (SELECT submitted_at FROM jobs WHERE job_id = $1), $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
        job_id, spec.tenant, spec.gpus, spec.gpu_model, spec.priority, spec.nodes, share.milli if share else None,
        share.memory_mib if share else None, spec.mig_profile, spec.cpu_milli, spec.memory_mib)


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
    for other in state.node_ids:  # a gang runs whole or not at all: its other members stop too
        if other != node_id and other not in state.exited_nodes:
            await send_command(conn, ev.StopJob(job_id=job_id, node_id=other, reason=reason), other, now)
    assert state.spec is not None
    # requeued, it still runs on the model its quota is charged for
    await queue_for_placement(conn, job_id, bound_to_charge(state.spec, state.charged_model))
    return True


def bound_to_charge(spec: ev.JobSpec, charged_model: str | None) -> ev.JobSpec:
    """A reservation charged to one GPU model binds the job to it (a flavor that is not a model, such as
    a MIG family, does not)."""
    charged = canonical_model(charged_model) if charged_model else None
    return spec if charged is None else spec.model_copy(update={"gpu_model": charged})


async def check_leases(conn: asyncpg.Connection, now: datetime, policy: engine.PlacementPolicy) -> list[str]:
    """Declare silent nodes lost, requeue their jobs once, and place again; returns the nodes lost."""
    await lock_cycle(conn)
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
        await run_cycle(conn, now, policy)
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
        "INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib, healthy, mig_enabled, nvlink_domain)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        " ON CONFLICT (node_id, gpu_index) DO UPDATE SET uuid = EXCLUDED.uuid, model = EXCLUDED.model,"
        " memory_mib = EXCLUDED.memory_mib, healthy = EXCLUDED.healthy, mig_enabled = EXCLUDED.mig_enabled,"
        " nvlink_domain = EXCLUDED.nvlink_domain",
        [(node.node_id, g.index, g.uuid, g.model, g.memory_mib, g.healthy, g.mig_enabled, g.nvlink_domain)
         for g in node.gpus])
    # Under the cycle lock, the list holds every placement committed so far, and any later one commits
    # (and so is published) after this answer: the agent never sees a StartJob its ReconcileJobs denies.
    await lock_cycle(conn)
    assigned = await conn.fetch("SELECT DISTINCT job_id FROM gpu_allocations WHERE node_id = $1 ORDER BY job_id",
                                node.node_id)
    reconcile = ev.ReconcileJobs(node_id=node.node_id, job_ids=[r["job_id"] for r in assigned],
                                 lease_epoch=node.lease_epoch)
    await send_command(conn, reconcile, node.node_id, now)


async def release_gpus(conn: asyncpg.Connection, job_id: str, now: datetime, stop_reason: str | None = None) -> None:
    rows = await conn.fetch("DELETE FROM gpu_allocations WHERE job_id = $1 RETURNING node_id", job_id)
    if stop_reason is not None:
        for node_id in sorted({r["node_id"] for r in rows}):
            await send_command(conn, ev.StopJob(job_id=job_id, node_id=node_id, reason=stop_reason), node_id, now)


