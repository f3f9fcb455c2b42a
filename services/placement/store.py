"""All of placement's SQL: its queue (``placement_pending``), nodes and their leases, GPUs, allocations and
nominations, and the commands it sends node agents through its outbox. The cluster and the queue are read
with the shared ``gpusched_common.stores.cluster`` (the preemption service and the CLI read them the same
way)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import events as ev
from gpusched_common.store import append, enqueue_keyed
from gpusched_common.stores.cluster import lock_cycle
from gpusched_common.topics import NODES_COMMANDS
from gpusched_common.tracing import current_traceparent

from gpusched_core.placement.cycle import Placement, required_labels
from gpusched_core.placement.launch import allocation_rows
from gpusched_core.placement.leases import NodeLease

SERVICE = "placement"
ALLOCATION_COLUMNS = ("node_id", "gpu_index", "job_id", "allocated_at", "milli", "memory_mib", "mig_profile",
                      "mig_start", "mig_memory_slices", "host_cpu_milli", "host_memory_mib")


def _pending_row(job_id: str, spec: ev.JobSpec) -> tuple:
    share = spec.gpu_share
    return (job_id, spec.tenant, spec.gpus, spec.gpu_model, spec.priority, spec.nodes, share.milli if share else None,
            share.memory_mib if share else None, spec.mig_profile, spec.cpu_milli, spec.memory_mib,
            dict(required_labels(spec)))


_PENDING_COLUMNS = ("placement_pending (job_id, tenant, gpus, gpu_model, priority, submitted_at, nodes, share_milli,"
                    " share_memory_mib, mig_profile, cpu_milli, memory_mib, node_selector)")
_PENDING_FIELDS = ("job_id", "tenant", "gpus", "gpu_model", "priority", "nodes", "share_milli", "share_memory_mib",
                   "mig_profile", "cpu_milli", "memory_mib", "node_selector")


async def queue_for_placement(conn: asyncpg.Connection, job_id: str, spec: ev.JobSpec) -> None:
    """Queue a job its caller judged, under the cycle lock, from what it read under that lock."""
    await conn.execute(
        f"INSERT INTO {_PENDING_COLUMNS} VALUES ($1, $2, $3, $4, $5, (SELECT submitted_at FROM jobs WHERE job_id = $1),"
        " $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING", *_pending_row(job_id, spec))


async def queue_if_waiting(conn: asyncpg.Connection, job_id: str, spec: ev.JobSpec) -> bool:
    """``queue_many_if_waiting`` for one job: whether it was queued."""
    return bool(await queue_many_if_waiting(conn, [(job_id, spec)]))


async def queue_many_if_waiting(conn: asyncpg.Connection, jobs: list[tuple[str, ev.JobSpec]]) -> list[str]:
    """Queue these jobs, in this order, in one statement, leaving out each the store has other than Queued or
    holding GPUs (or queued already); the jobs queued. Called under the cycle lock by callers that may have
    read a job's stream before they took it (a batch reads its messages' streams at its start): the rows this
    statement reads under the lock have the last word, so a job a cycle placed in between is never queued
    again."""
    if not jobs:
        return []
    rows = json.dumps([{**dict(zip(_PENDING_FIELDS, _pending_row(job_id, spec), strict=True)), "ord": i}
                       for i, (job_id, spec) in enumerate(jobs)])
    queued = await conn.fetch(
        f"INSERT INTO {_PENDING_COLUMNS} SELECT r.job_id, r.tenant, r.gpus, r.gpu_model, r.priority, j.submitted_at,"
        " r.nodes, r.share_milli, r.share_memory_mib, r.mig_profile, r.cpu_milli, r.memory_mib, r.node_selector"
        " FROM jsonb_to_recordset($1::text::jsonb) AS r(job_id text, tenant text, gpus integer,"
        " gpu_model text, priority integer, nodes integer, share_milli integer, share_memory_mib integer,"
        " mig_profile text, cpu_milli integer, memory_mib bigint, node_selector jsonb, ord integer)"
        " JOIN jobs j ON j.job_id = r.job_id AND j.status = 'Queued'"
        " WHERE NOT EXISTS (SELECT 1 FROM gpu_allocations a WHERE a.job_id = r.job_id)"
        " ORDER BY r.ord ON CONFLICT DO NOTHING RETURNING job_id", rows)
    return [r["job_id"] for r in queued]


async def set_last_reasons_many(conn: asyncpg.Connection, reasons: list[tuple[str, tuple[str, ...]]]) -> None:
    """Each job's reasons as last told in its stream (several jobs, one statement)."""
    if reasons:
        await conn.execute(
            "UPDATE placement_pending p SET last_reasons = r.reasons"
            " FROM jsonb_to_recordset($1::text::jsonb) AS r(job_id text, reasons jsonb) WHERE p.job_id = r.job_id",
            json.dumps([{"job_id": job_id, "reasons": list(why)} for job_id, why in reasons]))


async def forget_pending(conn: asyncpg.Connection, job_id: str) -> None:
    """The job waits for placement no more (placed or cancelled), nor are GPUs held for it."""
    await forget_pending_many(conn, [job_id])


async def forget_pending_many(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    await conn.execute("DELETE FROM placement_pending WHERE job_id = ANY($1::text[])", job_ids)
    await conn.execute("DELETE FROM gpu_nominations WHERE job_id = ANY($1::text[])", job_ids)


async def expire_nominations(conn: asyncpg.Connection, now: datetime, ttl_s: float) -> list[str]:
    """Give back GPUs held (nominated) for a job that has not been placed on them within ``ttl_s``: the
    jobs whose hold lapsed. The preemptor keeps its place in the queues; it just no longer has GPUs
    kept free for it (its victims are long gone, and others should not idle behind it)."""
    await lock_cycle(conn)
    rows = await conn.fetch("DELETE FROM gpu_nominations WHERE nominated_at < $1 RETURNING job_id",
                            now - timedelta(seconds=ttl_s))
    return sorted({r["job_id"] for r in rows})


async def allocate_many(conn: asyncpg.Connection, placements: list[Placement], now: datetime) -> None:
    """Hold the placements' GPUs (their rows sent at once). PostgreSQL refuses an allocation beyond capacity
    and fails the whole transaction: the primary key and the gpu_usage / mig_slices guards kept by a trigger
    (migration 009)."""
    columns = ", ".join(ALLOCATION_COLUMNS)
    values = ", ".join(f"${n}" for n in range(1, len(ALLOCATION_COLUMNS) + 1))
    await conn.executemany(f"INSERT INTO gpu_allocations ({columns}) VALUES ({values})",
                           [row for placement in placements for row in allocation_rows(placement, now)])


async def release_gpus(conn: asyncpg.Connection, job_id: str, node_id: str | None = None) -> list[str]:
    """Give back what the job holds (on ``node_id`` only, when given); the nodes it held GPUs on."""
    if node_id is None:
        rows = await conn.fetch("DELETE FROM gpu_allocations WHERE job_id = $1 RETURNING node_id", job_id)
    else:
        rows = await conn.fetch("DELETE FROM gpu_allocations WHERE job_id = $1 AND node_id = $2 RETURNING node_id",
                                job_id, node_id)
    return sorted({r["node_id"] for r in rows})


async def release_jobs(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    """Give back everything the jobs hold, one statement for all."""
    await conn.execute("DELETE FROM gpu_allocations WHERE job_id = ANY($1::text[])", job_ids)


async def nodes_of(conn: asyncpg.Connection, job_id: str) -> list[str]:
    """The nodes the job holds GPUs on."""
    rows = await conn.fetch("SELECT DISTINCT node_id FROM gpu_allocations WHERE job_id = $1 ORDER BY node_id", job_id)
    return [r["node_id"] for r in rows]


async def set_cordon(conn: asyncpg.Connection, node_id: str, cordon: bool, by: str, reason: str,
                     now: datetime, drain: bool = False) -> bool:
    """Cordon (and drain) or uncordon the node; False when there is no such node or it is so already."""
    if cordon:
        status = await conn.execute(
            "UPDATE nodes SET cordoned_at = coalesce(cordoned_at, $2), cordoned_by = coalesce(cordoned_by, $3),"
            " cordon_reason = coalesce(cordon_reason, $4),"
            " drain_requested_at = CASE WHEN $5 THEN coalesce(drain_requested_at, $2) ELSE drain_requested_at END"
            " WHERE node_id = $1 AND (cordoned_at IS NULL OR ($5 AND drain_requested_at IS NULL))",
            node_id, now, by, reason, drain)
    else:
        status = await conn.execute(
            "UPDATE nodes SET cordoned_at = NULL, cordoned_by = NULL, cordon_reason = NULL, drain_requested_at = NULL"
            " WHERE node_id = $1 AND cordoned_at IS NOT NULL", node_id)
    return status == "UPDATE 1"


async def record_node_event(conn: asyncpg.Connection, payload: ev.NodeCordoned | ev.NodeUncordoned,
                            now: datetime) -> None:
    """Append an operator's change of a node to the node's stream in the event store (its history)."""
    stream = f"node-{payload.node_id}"
    version = await conn.fetchval("SELECT coalesce(max(version), 0) FROM events WHERE stream_id = $1", stream)
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=stream, occurred_at=now,
                                producer=SERVICE, traceparent=current_traceparent())
    await append(conn, stream, version, [envelope])


async def jobs_on(conn: asyncpg.Connection, node_id: str) -> list[str]:
    """The jobs holding GPUs on the node, by id."""
    rows = await conn.fetch("SELECT DISTINCT job_id FROM gpu_allocations WHERE node_id = $1 ORDER BY job_id", node_id)
    return [r["job_id"] for r in rows]


async def hostnames_and_epochs(conn: asyncpg.Connection, node_ids: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    """Each node's hostname (what a gang's members reach each other by) and its lease epoch now (the fencing
    token of the runs placed there), in one query."""
    rows = await conn.fetch("SELECT node_id, hostname, lease_epoch FROM nodes WHERE node_id = ANY($1::text[])",
                            node_ids)
    return {r["node_id"]: r["hostname"] for r in rows}, {r["node_id"]: r["lease_epoch"] for r in rows}


async def upsert_node(conn: asyncpg.Connection, node: ev.NodeRegistered, now: datetime) -> None:
    """Record the node's inventory and new lease (the node is Ready again)."""
    await conn.execute(
        "INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend, registered_at,"
        " last_seen_at, lease_epoch, log_url, isolation) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8, $9, $10)"
        " ON CONFLICT (node_id) DO UPDATE"
        " SET hostname = EXCLUDED.hostname, labels = EXCLUDED.labels, cpu_milli = EXCLUDED.cpu_milli,"
        " memory_mib = EXCLUDED.memory_mib, nvml_backend = EXCLUDED.nvml_backend,"
        " last_seen_at = EXCLUDED.last_seen_at, lease_epoch = EXCLUDED.lease_epoch, status = 'Ready',"
        " log_url = EXCLUDED.log_url, quarantine_reasons = NULL, isolation = EXCLUDED.isolation,"
        " reported_jobs = NULL, reported_at = NULL",
        node.node_id, node.hostname, node.labels, node.cpu_milli, node.memory_mib, node.nvml_backend, now,
        node.lease_epoch, node.log_url, {k[:32]: v[:200] for k, v in node.isolation.items()})
    # its registration was answered with a ReconcileJobs: no drift, and none needed again before long
    await conn.execute("INSERT INTO node_drift (node_id, drift_since, reconciled_at) VALUES ($1, NULL, $2)"
                       " ON CONFLICT (node_id) DO UPDATE SET drift_since = NULL, reconciled_at = $2", node.node_id, now)
    await conn.executemany(
        "INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib, healthy, mig_enabled, nvlink_domain)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        " ON CONFLICT (node_id, gpu_index) DO UPDATE SET uuid = EXCLUDED.uuid, model = EXCLUDED.model,"
        " memory_mib = EXCLUDED.memory_mib, healthy = EXCLUDED.healthy, mig_enabled = EXCLUDED.mig_enabled,"
        " nvlink_domain = EXCLUDED.nvlink_domain",
        [(node.node_id, g.index, g.uuid, g.model, g.memory_mib, g.healthy, g.mig_enabled, g.nvlink_domain)
         for g in node.gpus])
    # a GPU the node no longer has (it came back with fewer) is out of service: nothing is placed on it (its
    # row stays for the allocations and history that name it; registered with it again, it serves again)
    await conn.execute("UPDATE gpus SET healthy = false WHERE node_id = $1 AND NOT (gpu_index = ANY($2::int[]))",
                       node.node_id, [g.index for g in node.gpus])


async def quarantine_node(conn: asyncpg.Connection, node: ev.NodeRegistered, reasons: list[str], now: datetime) -> None:
    """Keep the node out of placement with the reasons its registration was refused; its GPUs as they were
    (a new node has none). Its lease goes on: a quarantined node that falls silent is still declared lost."""
    await conn.execute(
        "INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend, registered_at,"
        " last_seen_at, lease_epoch, status, quarantine_reasons) VALUES ($1, $2, '{}'::jsonb, 0, 0, $3, $4, $4, 0,"
        " 'Quarantined', $5) ON CONFLICT (node_id) DO UPDATE SET status = 'Quarantined',"
        " quarantine_reasons = EXCLUDED.quarantine_reasons, last_seen_at = EXCLUDED.last_seen_at",
        node.node_id, node.hostname[:256], node.nvml_backend[:64], now, reasons[:20])


async def record_heartbeats(conn: asyncpg.Connection, beats: list[ev.NodeHeartbeat], now: datetime) -> None:
    """Renew the nodes' leases in one statement (a batch's heartbeats, at most one per node), each unless its
    epoch was declared lost or is older than the node's registered one."""
    if not beats:
        return
    rows = [{"node_id": b.node_id, "epoch": b.lease_epoch, "ttl_s": b.lease_ttl_s, "grace_s": b.fence_grace_s,
             "jobs": b.running_jobs} for b in beats]
    await conn.execute(
        "UPDATE nodes n SET last_seen_at = $1, lease_epoch = b.epoch, lease_ttl_s = b.ttl_s,"
        " fence_grace_s = b.grace_s, reported_jobs = b.jobs, reported_at = $1"
        " FROM jsonb_to_recordset($2::text::jsonb)"
        "  AS b(node_id text, epoch bigint, ttl_s double precision, grace_s double precision, jobs text[])"
        " WHERE n.node_id = b.node_id AND n.lease_epoch <= b.epoch AND (n.lost_epoch IS NULL OR n.lost_epoch < b.epoch)",
        now, json.dumps(rows))


async def record_heartbeat(conn: asyncpg.Connection, beat: ev.NodeHeartbeat, now: datetime) -> None:
    """Renew one node's lease (``record_heartbeats``)."""
    await record_heartbeats(conn, [beat], now)


async def set_gpu_health(conn: asyncpg.Connection, node_id: str, gpu_index: int, healthy: bool) -> None:
    await conn.execute("UPDATE gpus SET healthy = $3 WHERE node_id = $1 AND gpu_index = $2", node_id, gpu_index,
                       healthy)


@dataclass(frozen=True)
class EpochFloor:
    """The epochs a node has used, as the store knows them: its lease's, and the last one declared lost."""
    lease_epoch: int
    lost_epoch: int | None

    def accepts(self, epoch: int) -> bool:
        """Only an epoch above every one the node used: an agent registers once per epoch, so a second
        registration at one it had is an agent that forgot it (its directory wiped), and the commands of
        that epoch in the broker must not pass for its."""
        return epoch > self.lease_epoch and (self.lost_epoch is None or epoch > self.lost_epoch)

    @property
    def next_epoch(self) -> int:
        return max(self.lease_epoch, self.lost_epoch or 0) + 1


async def epoch_floor(conn: asyncpg.Connection, node_id: str) -> EpochFloor | None:
    row = await conn.fetchrow("SELECT lease_epoch, lost_epoch FROM nodes WHERE node_id = $1", node_id)
    return None if row is None else EpochFloor(row["lease_epoch"], row["lost_epoch"])


async def lost_epoch(conn: asyncpg.Connection, node_id: str) -> int | None:
    return await conn.fetchval("SELECT lost_epoch FROM nodes WHERE node_id = $1", node_id)


async def lost_epochs(conn: asyncpg.Connection, node_ids: list[str]) -> dict[str, int | None]:
    """``lost_epoch`` of each of ``node_ids`` (an unknown node: None), one query for all."""
    rows = await conn.fetch("SELECT node_id, lost_epoch FROM nodes WHERE node_id = ANY($1::text[])", node_ids)
    found = {r["node_id"]: r["lost_epoch"] for r in rows}
    return {node_id: found.get(node_id) for node_id in node_ids}


async def leases(conn: asyncpg.Connection) -> list[NodeLease]:
    rows = await conn.fetch(
        "SELECT node_id, lease_epoch, last_seen_at, lease_ttl_s, fence_grace_s, status FROM nodes")
    return [NodeLease(r["node_id"], r["lease_epoch"], r["last_seen_at"], r["lease_ttl_s"], r["fence_grace_s"],
                      r["status"] == "Lost") for r in rows]


async def mark_lost(conn: asyncpg.Connection, node_id: str) -> None:
    await conn.execute("UPDATE nodes SET status = 'Lost', lost_epoch = lease_epoch WHERE node_id = $1", node_id)


async def refresh_leases(conn: asyncpg.Connection, now: datetime) -> None:
    """Give every node a fresh lease (at start: heartbeats sent while placement was down are still in
    Kafka, not yet in the table)."""
    await conn.execute("UPDATE nodes SET last_seen_at = greatest(last_seen_at, $1)", now)


async def send_command(conn: asyncpg.Connection, payload: ev.Payload, node_id: str, now: datetime,
                       traceparent: str | None = None) -> None:
    """To the node's agent, through placement's outbox (its relay publishes it)."""
    await send_commands(conn, [(payload, node_id, traceparent)], now)


async def send_commands(conn: asyncpg.Connection, commands: list[tuple[ev.Payload, str, str | None]],
                        now: datetime) -> None:
    """Several (command, node, traceparent) to their nodes' agents, in order, in one statement."""
    envelopes = [(node_id, ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{node_id}",
                                            occurred_at=now, producer=SERVICE,
                                            traceparent=traceparent or current_traceparent()))
                 for payload, node_id, traceparent in commands]
    await enqueue_keyed(conn, producer=SERVICE, topic=NODES_COMMANDS.name, messages=envelopes)


async def stop_on(conn: asyncpg.Connection, job_id: str, node_ids, reason: str, now: datetime,
                  attempt: int | None = None) -> None:
    """A StopJob of ``job_id``'s run ``attempt`` (the job's current run, from its state) to each of ``node_ids``."""
    for node_id in node_ids:
        await send_command(conn, ev.StopJob(job_id=job_id, node_id=node_id, reason=reason, attempt=attempt),
                           node_id, now)
