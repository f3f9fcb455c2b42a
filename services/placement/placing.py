"""Placement's shell around a cycle: load the cluster and the queue from PostgreSQL, run the pure cycle
(`placement.cycle`) under the configured engine policy, and commit what it decided."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import decider
from gpusched_common import events as ev
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.store import enqueue
from gpusched_common.topics import NODES_COMMANDS
from gpusched_common.tracing import current_traceparent

from gpusched_core import placement as engine
from services.placement.core import Deferral, PendingJob, Placement
from services.placement.cycle import GpuRow, Held, NodeRow, build_cluster, run_plan

SERVICE = "placement"
CYCLE_LOCK = 727_100  # one placer decides at a time, whichever replica holds it


async def lock_cycle(conn: asyncpg.Connection) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock($1)", CYCLE_LOCK)


async def expire_nominations(conn: asyncpg.Connection, now: datetime, ttl_s: float) -> list[str]:
    """Give back GPUs held (nominated) for a job that has not been placed on them within ``ttl_s``: the
    jobs whose hold lapsed. The preemptor keeps its place in the queues; it just no longer has GPUs
    kept free for it (its victims are long gone, and others should not idle behind it)."""
    await lock_cycle(conn)
    rows = await conn.fetch("DELETE FROM gpu_nominations WHERE nominated_at < $1 RETURNING job_id",
                            now - timedelta(seconds=ttl_s))
    return sorted({r["job_id"] for r in rows})


async def load_cluster(conn: asyncpg.Connection) -> tuple[list[NodeRow], engine.ClusterSnapshot]:
    """Ready nodes (a lost node takes no new work), their GPUs, allocations and nominations."""
    node_rows = await conn.fetch("SELECT node_id, cpu_milli, memory_mib, labels FROM nodes WHERE status = 'Ready'")
    gpus_of: dict[str, list[GpuRow]] = {r["node_id"]: [] for r in node_rows}
    for r in await conn.fetch(
            "SELECT g.node_id, g.gpu_index, g.uuid, g.model, g.memory_mib, g.healthy, g.mig_enabled, g.nvlink_domain"
            " FROM gpus g JOIN nodes n USING (node_id) WHERE n.status = 'Ready' ORDER BY g.node_id, g.gpu_index"):
        gpus_of[r["node_id"]].append(GpuRow(r["gpu_index"], r["uuid"], r["model"], r["memory_mib"], r["healthy"],
                                            r["mig_enabled"], r["nvlink_domain"]))
    nodes = {r["node_id"]: NodeRow(r["node_id"], r["cpu_milli"], r["memory_mib"], tuple(gpus_of[r["node_id"]]),
                                   {engine.MODEL_LABEL: gpus_of[r["node_id"]][0].model, **(r["labels"] or {})})
             for r in node_rows if gpus_of[r["node_id"]]}
    ready = set(nodes)
    allocations: dict[str, list[Held]] = {}
    for r in await conn.fetch("SELECT job_id, node_id, gpu_index, milli, memory_mib, mig_profile, mig_start,"
                              " host_cpu_milli, host_memory_mib FROM gpu_allocations ORDER BY job_id, node_id, gpu_index"):
        if r["node_id"] in ready:
            allocations.setdefault(r["job_id"], []).append(
                Held(r["node_id"], r["gpu_index"], r["milli"], r["memory_mib"], r["mig_profile"], r["mig_start"],
                     r["host_cpu_milli"], r["host_memory_mib"]))
    busy = {(h.node_id, h.gpu_index) for held in allocations.values() for h in held}
    # a nomination counts once its victim has let go of the GPU; until then the victim's allocation holds it
    nominated: dict[str, list[tuple[str, int]]] = {}
    for r in await conn.fetch("SELECT job_id, node_id, gpu_index FROM gpu_nominations ORDER BY job_id"):
        if r["node_id"] in ready and (r["node_id"], r["gpu_index"]) not in busy:
            nominated.setdefault(r["job_id"], []).append((r["node_id"], r["gpu_index"]))
    rows = list(nodes.values())
    return rows, build_cluster(rows, allocations, nominated)


class ClusterCache:
    """The cluster as this process last loaded or placed onto it, tagged with the store's placement version
    (migration 012). A cycle reuses it while nobody else changed nodes, GPUs, allocations or nominations,
    and otherwise loads the cluster again; both are read under the cycle lock, which every writer of
    those tables holds, so the version read at a cycle's end covers exactly that cycle's own writes."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._nodes: list[NodeRow] = []
        self._snapshot: engine.ClusterSnapshot | None = None
        self.hits = 0
        self.loads = 0

    async def load(self, conn: asyncpg.Connection) -> tuple[list[NodeRow], engine.ClusterSnapshot]:
        version = await conn.fetchval("SELECT version FROM placement_version")
        if self._snapshot is not None and version == self._version:
            self.hits += 1
            return self._nodes, self._snapshot
        self.loads += 1
        return await load_cluster(conn)

    async def keep(self, conn: asyncpg.Connection, nodes: list[NodeRow], snapshot: engine.ClusterSnapshot) -> None:
        """Remember the cluster as this transaction leaves it; should the transaction roll back, its
        version is never seen again and the next cycle loads afresh."""
        self._version = await conn.fetchval("SELECT version FROM placement_version")
        self._nodes, self._snapshot = nodes, snapshot

    def forget(self) -> None:
        self._version, self._snapshot = None, None


CACHE = ClusterCache()  # one per placement process


async def run_cycle(conn: asyncpg.Connection, now: datetime, policy: engine.PlacementPolicy,
                    cache: ClusterCache = CACHE) -> None:
    await lock_cycle(conn)
    rows = await conn.fetch(
        "SELECT job_id, gpus, gpu_model, priority, seq, submitted_at, last_reasons, nodes, share_milli,"
        " share_memory_mib, mig_profile, cpu_milli, memory_mib FROM placement_pending")
    if not rows:
        return
    pending = [PendingJob(r["job_id"], r["gpus"], r["gpu_model"], r["priority"], r["seq"], r["submitted_at"],
                          r["nodes"], r["share_milli"], r["share_memory_mib"] or 0, r["mig_profile"], r["cpu_milli"],
                          r["memory_mib"]) for r in rows]
    last_reasons = {r["job_id"]: r["last_reasons"] for r in rows}
    nodes, snapshot = await cache.load(conn)
    placements, deferrals, after = run_plan(snapshot, pending, policy, nodes)
    exact = True
    for placement in placements:
        exact &= await commit_placement(conn, placement, now, policy.name)
    for deferral in deferrals:
        await record_deferral(conn, deferral, last_reasons[deferral.job_id], now)
    if exact:
        await cache.keep(conn, nodes, after)
    else:  # a placement the job's stream refused: the store and the plan differ, so load it next time
        cache.forget()


async def record_deferral(conn: asyncpg.Connection, deferral: Deferral, last: list[str] | None,
                          now: datetime) -> None:
    if last == list(deferral.reasons):
        return  # the same reasons again: nothing new to tell
    state = await load_job(conn, deferral.job_id)
    await append_job_events(conn, state, decider.decide(state, decider.DeferPlacement(deferral.reasons), now),
                            producer=SERVICE, now=now)
    await conn.execute("UPDATE placement_pending SET last_reasons = $2 WHERE job_id = $1", deferral.job_id,
                       list(deferral.reasons))


async def commit_placement(conn: asyncpg.Connection, placement: Placement, now: datetime, policy: str) -> bool:
    """Record one placement; False when the job's stream refused it (it was placed or ended meanwhile)."""
    state = await load_job(conn, placement.job_id)
    members = tuple(decider.Member(m.node_id, m.gpu_indices, m.gpu_uuids) for m in placement.members)
    command = decider.Place(placement.node_id, placement.gpu_indices, placement.gpu_uuids, placement.gpu_model,
                            policy, placement.reason, members=members, share_milli=placement.share_milli,
                            share_memory_mib=placement.share_memory_mib, mig_profile=placement.mig_profile,
                            mig_start=placement.mig_start)
    events = decider.decide(state, command, now)
    await conn.execute("DELETE FROM placement_pending WHERE job_id = $1", placement.job_id)
    await conn.execute("DELETE FROM gpu_nominations WHERE job_id = $1", placement.job_id)
    if not events:
        return False
    # PostgreSQL refuses an allocation beyond capacity and fails the whole transaction: the primary key and
    # the gpu_usage / mig_slices guards kept by a trigger (migration 009)
    await conn.executemany(
        "INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at, milli, memory_mib, mig_profile,"
        " mig_start, mig_memory_slices, host_cpu_milli, host_memory_mib)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        allocation_rows(placement, now))
    placed = await append_job_events(conn, state, events, producer=SERVICE, now=now)
    spec = state.spec
    assert spec is not None
    hostnames = dict(await conn.fetch("SELECT node_id, hostname FROM nodes WHERE node_id = ANY($1::text[])",
                                      [m.node_id for m in placement.all_members]))
    for rank, member in enumerate(placement.all_members):
        start = ev.StartJob(job_id=placement.job_id, node_id=member.node_id, tenant=spec.tenant,
                            gpu_indices=list(member.gpu_indices), gpu_uuids=list(member.gpu_uuids),
                            command=spec.command, env={**resume_env(state), **host_env(placement, spec.env),
                                                       **gang_env(placement, rank, hostnames)},
                            attempt=placed.runs, gpu_share_milli=placement.share_milli,
                            gpu_memory_mib=placement.share_memory_mib or None, mig_profile=placement.mig_profile,
                            mig_start=placement.mig_start)
        # the agent continues the job's trace from the JobPlaced event
        await send_command(conn, start, member.node_id, now, traceparent=placed.trace_parent)
    return True


def allocation_rows(placement: Placement, now: datetime) -> list[tuple]:
    """gpu_allocations rows: one per whole GPU of every member, or the one share / MIG instance. A MIG
    instance charges its part of the GPU's 8 memory slices (at least 1 milli), so no whole GPU or share
    can join it on that GPU. The job's host CPU and memory ride on its first (lowest) GPU of each node
    (migration 014), so whatever gives the GPUs back gives them back too."""
    job, host = placement.job_id, (placement.cpu_milli, placement.memory_mib)
    if placement.mig_profile is not None:
        slices = placement.mig_memory_slices or 1
        milli = max(1, slices * engine.MILLI_PER_GPU // 8)
        return [(placement.node_id, placement.gpu_indices[0], job, now, milli, 0, placement.mig_profile,
                 placement.mig_start, slices, *host)]
    if placement.share_milli is not None:
        return [(placement.node_id, placement.gpu_indices[0], job, now, placement.share_milli,
                 placement.share_memory_mib or 0, None, None, None, *host)]
    return [(m.node_id, i, job, now, engine.MILLI_PER_GPU, 0, None, None, None,
             *(host if i == min(m.gpu_indices) else (0, 0)))
            for m in placement.all_members for i in m.gpu_indices]


def gang_env(placement: Placement, rank: int, hostnames: dict[str, str]) -> dict[str, str]:
    """What each member of a gang learns about the others (the names torchrun and MPI launchers read)."""
    if not placement.members:
        return {}
    nodes = [m.node_id for m in placement.members]
    return {"GPUSCHED_GANG_SIZE": str(len(nodes)), "GPUSCHED_GANG_RANK": str(rank),
            "GPUSCHED_GANG_NODES": ",".join(nodes), "NNODES": str(len(nodes)), "NODE_RANK": str(rank),
            "MASTER_ADDR": hostnames.get(nodes[0], nodes[0])}


def host_env(placement: Placement, env: Mapping[str, str]) -> dict[str, str]:
    """What a job learns of the host CPU and memory it holds on its node; ``OMP_NUM_THREADS`` follows its
    whole CPUs unless the job sets its own (many CPU thread pools size themselves from it)."""
    out = {}
    if placement.cpu_milli:
        out["GPUSCHED_CPU_MILLI"] = str(placement.cpu_milli)
        if "OMP_NUM_THREADS" not in env:
            out["OMP_NUM_THREADS"] = str(max(1, placement.cpu_milli // 1000))
    if placement.memory_mib:
        out["GPUSCHED_MEMORY_MIB"] = str(placement.memory_mib)
    return out


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
