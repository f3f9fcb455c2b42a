"""The cluster as placement keeps it in PostgreSQL: ready nodes, their GPUs, allocations and the GPUs held
(nominated) for a preemptor; and placement's queue (``pending_jobs``, in placement's order once sorted by
``order_pending``). Placement owns these tables; the preemption service reads them through ``load_cluster``
under ``lock_cycle``, so it judges a victim's release on the cluster placement will see; the metrics
service and the CLI read them here too.

The preemption service also holds GPUs for a preemptor (``nominate``): placement offers them to that job
only, and gives them back after its nomination TTL.

Every writer of nodes, GPUs, allocations or nominations holds ``lock_cycle`` until its transaction ends
(placement's cycle cache, migration 012, depends on it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from gpusched_core import placement as engine
from gpusched_core.placement.cycle import GpuRow, Held, NodeRow, PendingPlacement, build_cluster

CYCLE_LOCK = 727_100  # advisory lock id: one placer decides at a time, whichever replica holds it


async def lock_cycle(conn: asyncpg.Connection) -> None:
    """Take the placement cycle lock until the transaction ends."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", CYCLE_LOCK)


async def load_cluster(conn: asyncpg.Connection) -> tuple[list[NodeRow], engine.ClusterSnapshot]:
    """Ready, uncordoned nodes (a lost or cordoned node takes no new work), their GPUs, allocations and
    nominations."""
    node_rows = await conn.fetch("SELECT node_id, cpu_milli, memory_mib, labels FROM nodes"
                                 " WHERE status = 'Ready' AND cordoned_at IS NULL")
    gpus_of: dict[str, list[GpuRow]] = {r["node_id"]: [] for r in node_rows}
    for r in await conn.fetch(
            "SELECT g.node_id, g.gpu_index, g.uuid, g.model, g.memory_mib, g.healthy, g.mig_enabled, g.nvlink_domain"
            " FROM gpus g JOIN nodes n USING (node_id) WHERE n.status = 'Ready' AND n.cordoned_at IS NULL"
            " ORDER BY g.node_id, g.gpu_index"):
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
    # a whole GPU's nomination counts once its victim has let go of the GPU; until then the victim's
    # allocation holds it (a share or a MIG instance counts once it fits: ``build_cluster``)
    nominated: dict[str, list[Held]] = {}
    for r in await conn.fetch("SELECT job_id, node_id, gpu_index, milli, memory_mib, mig_profile, mig_start"
                              " FROM gpu_nominations ORDER BY job_id, node_id, gpu_index"):
        whole = r["mig_profile"] is None and r["milli"] >= engine.MILLI_PER_GPU
        if r["node_id"] in ready and not (whole and (r["node_id"], r["gpu_index"]) in busy):
            nominated.setdefault(r["job_id"], []).append(
                Held(r["node_id"], r["gpu_index"], r["milli"], r["memory_mib"], r["mig_profile"], r["mig_start"]))
    rows = list(nodes.values())
    return rows, build_cluster(rows, allocations, nominated)


async def nominate(conn: asyncpg.Connection, job_id: str, placement: engine.Decision | None, now: datetime) -> None:
    """Hold the GPUs of the preemptor's verified slot: placement offers them to no other job meanwhile."""
    if placement is None:
        return
    await conn.executemany(
        "INSERT INTO gpu_nominations (node_id, gpu_index, job_id, nominated_at, milli, memory_mib, mig_profile,"
        " mig_start) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
        [(str(b.node_id), i, job_id, now, b.gpu_milli, b.gpu_memory_mib, b.mig.profile if b.mig else None,
          b.mig.start if b.mig else None)
         for b in placement.bindings for i in b.gpu_indices])


async def nominated(conn: asyncpg.Connection, job_ids: list[str]) -> set[str]:
    """Those of ``job_ids`` GPUs are held for (their victims are stopping)."""
    if not job_ids:
        return set()
    return {r["job_id"] for r in await conn.fetch(
        "SELECT DISTINCT job_id FROM gpu_nominations WHERE job_id = ANY($1::text[])", job_ids)}


@dataclass(frozen=True)
class GpuSlotRow:
    """A GPU of any node (ready or not) and the job that has held it longest (shares and MIG slices: the
    earliest of its allocations); ``pool``: the node's value of the pool label asked for."""

    node_id: str
    gpu_index: int
    model: str
    healthy: bool
    pool: str | None
    job_id: str | None
    allocated_at: datetime | None


async def gpu_slots(conn: asyncpg.Connection, pool_label: str) -> list[GpuSlotRow]:
    """Every GPU with its node's pool and its earliest allocation, in (node, index) order."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (g.node_id, g.gpu_index) g.node_id, g.gpu_index, g.model, g.healthy,"
        " n.labels ->> $1 AS pool, a.job_id, a.allocated_at"
        " FROM gpus g JOIN nodes n USING (node_id) LEFT JOIN gpu_allocations a USING (node_id, gpu_index)"
        " ORDER BY g.node_id, g.gpu_index, a.allocated_at, a.job_id", pool_label)
    return [GpuSlotRow(**dict(r)) for r in rows]


PENDING_READ_ROWS = 2000  # rows a cycle's read of placement's queue holds at once


async def pending_jobs(conn: asyncpg.Connection, *,
                       unweighed_only: bool = False) -> tuple[list[PendingPlacement], dict[str, list[str] | None]]:
    """The jobs waiting for placement and the reasons each was last deferred with (``unweighed_only``: only
    those no cycle has deferred yet, which have none; migration 037).

    Inside a transaction (every cycle) the rows come through a cursor, ``PENDING_READ_ROWS`` at a time, so a
    queue of tens of thousands is never held twice over, as rows and as jobs; the values a queue repeats
    (models, selectors, and the reasons that jobs of one shape share) are kept once each, the reasons decoded
    once per distinct list. The lists are shared: read them, never change them."""
    query = ("SELECT job_id, gpus, gpu_model, priority, seq, submitted_at, last_reasons::text, nodes, share_milli,"
             " share_memory_mib, mig_profile, cpu_milli, memory_mib, node_selector::text FROM placement_pending"
             + (" WHERE last_reasons IS NULL" if unweighed_only else ""))
    once: dict[Any, Any] = {}
    selectors: dict[str, tuple[tuple[str, str], ...]] = {}
    reasons_by_text: dict[str | None, list[str] | None] = {None: None}
    pending: list[PendingPlacement] = []
    last_reasons: dict[str, list[str] | None] = {}

    def take(row: asyncpg.Record) -> None:
        (job_id, gpus, model, priority, seq, submitted_at, reasons, nodes, share_milli, share_memory_mib, mig, cpu,
         memory, selector) = row
        if selector not in selectors:
            selectors[selector] = tuple(sorted(json.loads(selector).items()))
        if reasons not in reasons_by_text:
            reasons_by_text[reasons] = json.loads(reasons)
        pending.append(PendingPlacement(job_id, gpus, once.setdefault(model, model), priority, seq, submitted_at,
                                        nodes, share_milli, share_memory_mib or 0, once.setdefault(mig, mig), cpu,
                                        memory, selectors[selector]))
        last_reasons[job_id] = reasons_by_text[reasons]

    if conn.is_in_transaction():
        async for row in conn.cursor(query, prefetch=PENDING_READ_ROWS):
            take(row)
    else:  # a reader's one-off listing
        for row in await conn.fetch(query):
            take(row)
    return pending, last_reasons


RECONSIDER_LIMIT = 500  # deferred jobs the preemption service weighs again at each pass (its reconsider loop)


async def deferred_jobs(conn: asyncpg.Connection, limit: int = RECONSIDER_LIMIT) -> list[str]:
    """Jobs placement deferred that still wait (no GPUs held for them), highest priority first, then in the
    order they came to placement's queue."""
    rows = await conn.fetch(
        "SELECT job_id FROM placement_pending p WHERE last_reasons IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM gpu_nominations n WHERE n.job_id = p.job_id)"
        " ORDER BY priority DESC, seq LIMIT $1", limit)
    return [r["job_id"] for r in rows]


async def counts(conn: asyncpg.Connection) -> tuple[int, int]:
    """How many nodes have registered (in any status) and how many GPUs they have."""
    row = await conn.fetchrow("SELECT (SELECT count(*) FROM nodes) AS nodes, (SELECT count(*) FROM gpus) AS gpus")
    return row["nodes"], row["gpus"]


async def node_inventory(conn: asyncpg.Connection) -> list[dict]:
    """Every registered node (ready or lost) with its lease state, GPU counts by health, GPU models, free
    (healthy, nothing allocated on it) and total GPUs by model, and how many allocations and distinct jobs
    it holds, by node id. For the gateway's nodes view."""
    rows = await conn.fetch(
        "SELECT n.node_id, n.hostname, n.status, n.labels, n.cpu_milli, n.memory_mib, n.lease_epoch, n.lost_epoch,"
        " n.cordoned_at, n.cordoned_by, n.cordon_reason, n.drain_requested_at, n.quarantine_reasons,"
        " n.lease_ttl_s, n.last_seen_at, n.registered_at, n.isolation,"
        " (SELECT count(*) FROM gpus g WHERE g.node_id = n.node_id) AS gpus,"
        " (SELECT count(*) FROM gpus g WHERE g.node_id = n.node_id AND g.healthy) AS healthy_gpus,"
        " (SELECT coalesce(array_agg(DISTINCT g.model), '{}') FROM gpus g WHERE g.node_id = n.node_id) AS gpu_models,"
        " (SELECT count(*) FROM gpu_allocations a WHERE a.node_id = n.node_id) AS allocations,"
        " (SELECT count(DISTINCT a.job_id) FROM gpu_allocations a WHERE a.node_id = n.node_id) AS jobs,"
        " (SELECT coalesce(jsonb_object_agg(m.model, jsonb_build_object('total', m.total, 'free', m.free)), '{}')"
        "  FROM (SELECT g.model, count(*) AS total, count(*) FILTER (WHERE g.healthy AND NOT EXISTS"
        "   (SELECT 1 FROM gpu_allocations a WHERE a.node_id = g.node_id AND a.gpu_index = g.gpu_index)) AS free"
        "   FROM gpus g WHERE g.node_id = n.node_id GROUP BY g.model) m) AS gpus_by_model"
        " FROM nodes n ORDER BY n.node_id")
    return [dict(r) for r in rows]


async def node_cordon(conn: asyncpg.Connection, node_id: str) -> dict[str, Any] | None:
    """Whether the node is cordoned, since when, by whom and why (None: no such node); for the gateway."""
    row = await conn.fetchrow("SELECT node_id, cordoned_at, cordoned_by, cordon_reason, drain_requested_at FROM nodes"
                              " WHERE node_id = $1", node_id)
    return dict(row) if row is not None else None


async def node_log_urls(conn: asyncpg.Connection, node_ids: list[str]) -> dict[str, str | None]:
    """Where each node serves its jobs' logs (None: it serves none); for the gateway."""
    rows = await conn.fetch("SELECT node_id, log_url FROM nodes WHERE node_id = ANY($1::text[])", node_ids)
    return {r["node_id"]: r["log_url"] for r in rows}


async def current_version(conn: asyncpg.Connection) -> int:
    """The placement version (migration 012): it moves with every committed change to nodes, GPUs, allocations
    or nominations."""
    return await conn.fetchval("SELECT version FROM placement_version")


class ClusterCache:
    """The cluster as this process last loaded or placed onto it, tagged with the store's placement version
    (migration 012). A cycle reuses it while nobody else changed nodes, GPUs, allocations or nominations,
    and otherwise loads the cluster again; both are read under the cycle lock, which every writer of
    those tables holds, so the version read at a cycle's end covers exactly that cycle's own writes."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._nodes: list[NodeRow] = []
        self._snapshot: engine.ClusterSnapshot | None = None
        self._weighed: int | None = None  # the version at which this process's last cycle weighed the whole queue
        self.hits = 0
        self.loads = 0

    def queue_weighed(self, version: int) -> bool:
        """Whether the cluster (at ``version``, read under the cycle lock) stands as this process's last cycle
        left it, after weighing every job of the queue: then every job that cycle deferred still finds no room
        (the cluster has only what it had, and a job that did not fit does not fit on less), and a cycle need
        weigh only those that came since."""
        return self._weighed is not None and version == self._weighed

    async def load(self, conn: asyncpg.Connection,
                   version: int | None = None) -> tuple[list[NodeRow], engine.ClusterSnapshot]:
        """The cluster now, kept for the next reader. Under the cycle lock no one else writes, so the version
        read first (or given: ``current_version`` in the same hold of the lock) is the version of what is
        loaded (a placer then ``keep``s what its cycle leaves)."""
        if version is None:
            version = await current_version(conn)
        if self._snapshot is not None and version == self._version:
            self.hits += 1
            return self._nodes, self._snapshot
        self.loads += 1
        nodes, snapshot = await load_cluster(conn)
        self._version, self._nodes, self._snapshot = version, nodes, snapshot
        return nodes, snapshot

    async def keep(self, conn: asyncpg.Connection, nodes: list[NodeRow], snapshot: engine.ClusterSnapshot, *,
                   weighed: bool = False) -> None:
        """Remember the cluster as this transaction leaves it (``weighed``: after a cycle that weighed every job
        waiting); should the transaction roll back, its version is never seen again and the next cycle loads
        afresh."""
        self._version = await current_version(conn)
        self._nodes, self._snapshot = nodes, snapshot
        self._weighed = self._version if weighed else None

    def forget(self) -> None:
        self._version, self._snapshot, self._weighed = None, None, None
