"""Placement's shell around a cycle: load the cluster and the queue from PostgreSQL, run the pure cycle
(`placement.cycle`) under the configured engine policy, and commit what it decided."""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.store import enqueue
from gpusched_common.topics import NODES_COMMANDS
from gpusched_common.tracing import current_traceparent

from services.placement import engine
from services.placement.core import Deferral, PendingJob, Placement
from services.placement.cycle import GpuRow, NodeRow, build_cluster, plan_cycle

SERVICE = "placement"
CYCLE_LOCK = 727_100  # one placer decides at a time, whichever replica holds it


async def lock_cycle(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock($1)", CYCLE_LOCK)


async def load_cluster(conn: asyncpg.Connection) -> tuple[list[NodeRow], engine.ClusterSnapshot]:
    """Ready nodes (a lost node takes no new work), their GPUs, allocations and nominations."""
    gpu_rows = await conn.fetch(
        "SELECT n.node_id, n.cpu_milli, n.memory_mib, n.labels, g.gpu_index, g.uuid, g.model, g.memory_mib AS gmem,"
        " g.healthy FROM nodes n JOIN gpus g ON g.node_id = n.node_id WHERE n.status = 'Ready'"
        " ORDER BY n.node_id, g.gpu_index")
    nodes: dict[str, NodeRow] = {}
    for r in gpu_rows:
        node = nodes.get(r["node_id"]) or NodeRow(r["node_id"], r["cpu_milli"], r["memory_mib"], (),
                                                   {engine.MODEL_LABEL: r["model"], **(r["labels"] or {})})
        gpu = GpuRow(r["gpu_index"], r["uuid"], r["model"], r["gmem"], r["healthy"])
        nodes[r["node_id"]] = NodeRow(node.node_id, node.cpu_milli, node.memory_mib, (*node.gpus, gpu), node.labels)
    ready = set(nodes)
    allocations = await _held(conn, "gpu_allocations", ready)
    busy = {gpu for gpus in allocations.values() for gpu in gpus}
    # a nomination counts once its victim has let go of the GPU; until then the victim's allocation holds it
    nominations = {job: free for job, gpus in (await _held(conn, "gpu_nominations", ready)).items()
                   if (free := [g for g in gpus if g not in busy])}
    rows = list(nodes.values())
    return rows, build_cluster(rows, allocations, nominations)


async def _held(conn: asyncpg.Connection, table: str, ready: set[str]) -> dict[str, list[tuple[str, int]]]:
    held: dict[str, list[tuple[str, int]]] = {}
    for r in await conn.fetch(f"SELECT job_id, node_id, gpu_index FROM {table} ORDER BY job_id"):  # noqa: S608
        if r["node_id"] in ready:
            held.setdefault(r["job_id"], []).append((r["node_id"], r["gpu_index"]))
    return held


async def run_cycle(conn: asyncpg.Connection, now: datetime, policy: engine.PlacementPolicy) -> None:
    await lock_cycle(conn)
    rows = await conn.fetch(
        "SELECT job_id, gpus, gpu_model, priority, seq, submitted_at, last_reasons FROM placement_pending")
    if not rows:
        return
    pending = [PendingJob(r["job_id"], r["gpus"], r["gpu_model"], r["priority"], r["seq"], r["submitted_at"])
               for r in rows]
    last_reasons = {r["job_id"]: r["last_reasons"] for r in rows}
    nodes, snapshot = await load_cluster(conn)
    placements, deferrals = plan_cycle(snapshot, pending, policy, nodes)
    for placement in placements:
        await commit_placement(conn, placement, now, policy.name)
    for deferral in deferrals:
        await record_deferral(conn, deferral, last_reasons[deferral.job_id], now)


async def record_deferral(conn: asyncpg.Connection, deferral: Deferral, last: list[str] | None,
                          now: datetime) -> None:
    if last == list(deferral.reasons):
        return  # the same reasons again: nothing new to tell
    state = await load_job(conn, deferral.job_id)
    await append_job_events(conn, state, decider.decide(state, decider.DeferPlacement(deferral.reasons), now),
                            producer=SERVICE, now=now)
    await conn.execute("UPDATE placement_pending SET last_reasons = $2 WHERE job_id = $1", deferral.job_id,
                       list(deferral.reasons))


async def commit_placement(conn: asyncpg.Connection, placement: Placement, now: datetime, policy: str) -> None:
    state = await load_job(conn, placement.job_id)
    command = decider.Place(placement.node_id, placement.gpu_indices, placement.gpu_uuids, placement.gpu_model,
                            policy, placement.reason)
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
                        command=spec.command, env=resume_env(state), attempt=placed.runs)
    # the agent continues the job's trace from the JobPlaced event
    await send_command(conn, start, placement.node_id, now, traceparent=placed.trace_parent)


def resume_env(state: decider.JobState) -> dict[str, str]:
    """The job's environment; a job resuming after a preemption learns its last checkpoint."""
    assert state.spec is not None
    if state.checkpoint_ref is None:
        return dict(state.spec.env)
    return {**state.spec.env, "GPUSCHED_RESUME_FROM": state.checkpoint_ref}


async def send_command(conn: asyncpg.Connection, payload: ev.Payload, node_id: str, now: datetime,
                       traceparent: str | None = None) -> None:
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{node_id}", occurred_at=now,
                                producer=SERVICE, traceparent=traceparent or current_traceparent())
    await enqueue(conn, producer=SERVICE, topic=NODES_COMMANDS.name, key=node_id, envelopes=[envelope])
