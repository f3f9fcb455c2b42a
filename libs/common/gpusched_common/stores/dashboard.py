"""What the dashboard reads (the gateway's GET /v1/cluster, /v1/history, /v1/tenants, /v1/queue), as plain
rows for ``gpusched_core.dashboard``: placement's nodes, GPUs and allocations, the metrics service's
``gpu_telemetry``, ``usage_samples`` and sampling instants (migration 032), the jobs read model and the
event store. Each read is one query over the whole cluster (no query per node): a thousand nodes of eight
GPUs are a few thousand rows. Also the allocations with their tenants, for the metrics service's samples.
The gateway's role may read every table named here (migrations 017 and 032)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from gpusched_core.dashboard import AllocationRow, GpuRow, PendingRow, ShareRow, TelemetryRow, UsageSample, WaitRow

PREEMPTED = "JobPreempted"  # gpusched_common.events.JobPreempted.TYPE (the event store's type column)


async def cluster_rows(conn: asyncpg.Connection) -> tuple[list[dict[str, Any]], list[GpuRow], list[AllocationRow],
                                                          list[TelemetryRow]]:
    """Every node (its lease and cordon state and how many allocations it holds: what the gateway's
    ``node_state`` reads), every GPU, every allocation with its job's tenant, and the latest reading of
    every GPU."""
    nodes = [dict(r) for r in await conn.fetch(
        "SELECT n.node_id, n.hostname, n.status, n.cordoned_at, n.drain_requested_at,"
        " coalesce(a.allocations, 0) AS allocations FROM nodes n"
        " LEFT JOIN (SELECT node_id, count(*) AS allocations FROM gpu_allocations GROUP BY node_id) a USING (node_id)"
        " ORDER BY n.node_id")]
    gpus = [GpuRow(r["node_id"], r["gpu_index"], r["model"], r["memory_mib"], r["healthy"], r["mig_enabled"])
            for r in await conn.fetch("SELECT node_id, gpu_index, model, memory_mib, healthy, mig_enabled FROM gpus")]
    allocations = [AllocationRow(**dict(r)) for r in await conn.fetch(
        "SELECT a.node_id, a.gpu_index, a.job_id, j.tenant, a.milli, a.memory_mib, a.mig_profile, a.mig_start,"
        " a.mig_memory_slices AS mig_slices FROM gpu_allocations a LEFT JOIN jobs j USING (job_id)")]
    telemetry = [TelemetryRow(**dict(r)) for r in await conn.fetch(
        "SELECT node_id, gpu_index, utilization_pct, memory_used_mib, healthy, sampled_at FROM gpu_telemetry")]
    return nodes, gpus, allocations, telemetry


async def allocation_shares(conn: asyncpg.Connection) -> list[ShareRow]:
    """Every allocation: its GPU, its job's tenant (None: no jobs row) and its milli."""
    rows = await conn.fetch("SELECT a.node_id, a.gpu_index, a.job_id, j.tenant, a.milli FROM gpu_allocations a"
                            " LEFT JOIN jobs j USING (job_id)")
    return [ShareRow(**dict(r)) for r in rows]


async def usage_rows(conn: asyncpg.Connection, since: datetime, until: datetime, tenant: str | None) -> list[UsageSample]:
    """``usage_samples`` in ``[since, until)`` of ``tenant`` (None: every tenant)."""
    rows = await conn.fetch(
        "SELECT sampled_at, tenant, gpu_model, allocated_gpus, busy_gpus, mean_utilization_pct FROM usage_samples"
        " WHERE sampled_at >= $1 AND sampled_at < $2 AND ($3::text IS NULL OR tenant = $3)"
        " ORDER BY sampled_at, tenant, gpu_model", since, until, tenant)
    return [UsageSample(**dict(r)) for r in rows]


async def sampling_instants(conn: asyncpg.Connection, since: datetime, until: datetime) -> list[datetime]:
    """Every instant the metrics service sampled at in ``[since, until)`` (its cluster_utilization rows, one
    per cycle, also when no tenant held a GPU): times only, nothing of any tenant."""
    rows = await conn.fetch("SELECT sampled_at FROM cluster_utilization WHERE sampled_at >= $1 AND sampled_at < $2",
                            since, until)
    return [r["sampled_at"] for r in rows]


async def placement_waits(conn: asyncpg.Connection, since: datetime, until: datetime,
                          tenant: str | None) -> list[WaitRow]:
    """Of each job placed in ``[since, until)`` (its latest placement): its tenant and submit->placed wait."""
    rows = await conn.fetch(
        "SELECT tenant, extract(epoch FROM placed_at - submitted_at)::float8 AS wait_s FROM jobs"
        " WHERE placed_at >= $1 AND placed_at < $2 AND submitted_at IS NOT NULL"
        " AND ($3::text IS NULL OR tenant = $3)", since, until, tenant)
    return [WaitRow(r["tenant"], r["wait_s"]) for r in rows]


async def preemptions(conn: asyncpg.Connection, since: datetime, until: datetime,
                      tenant: str | None) -> list[tuple[str | None, datetime]]:
    """(tenant, when) of every ``JobPreempted`` event in ``[since, until)``."""
    rows = await conn.fetch(
        "SELECT tenant, occurred_at FROM events WHERE type = $4 AND occurred_at >= $1 AND occurred_at < $2"
        " AND ($3::text IS NULL OR tenant = $3)", since, until, tenant, PREEMPTED)
    return [(r["tenant"], r["occurred_at"]) for r in rows]


# a job's shape from the queue it waits in (placement's, else quota's; None: in neither yet); ``gpus_per_node``:
# the queues' gpus, per node (the jobs row's ``gpus`` is the whole GPUs over every node)
_SHAPES = ("SELECT j.job_id, j.tenant, j.gpus, coalesce(p.gpus, q.gpus) AS gpus_per_node,"
           " coalesce(p.nodes, q.nodes) AS nodes, coalesce(p.share_milli, q.share_milli) AS share_milli,"
           " p.share_memory_mib, coalesce(p.mig_profile, q.mig_profile) AS mig_profile FROM jobs j"
           " LEFT JOIN placement_pending p USING (job_id) LEFT JOIN quota_policy_pending q USING (job_id)")
SHAPE_FIELDS = ("gpus_per_node", "nodes", "share_milli", "share_memory_mib", "mig_profile")


async def waiting_shapes(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The shape of each of these jobs as the queue it waits in stores it (placement's, else quota's; each
    field None while it is in neither): ``SHAPE_FIELDS``."""
    rows = await conn.fetch(_SHAPES + " WHERE j.job_id = ANY($1::text[])", job_ids)
    return {r["job_id"]: {k: r[k] for k in SHAPE_FIELDS} for r in rows}


async def pending_rows(conn: asyncpg.Connection, tenant: str | None) -> list[PendingRow]:
    """Every waiting job (Admitted or Queued) of ``tenant`` (None: all), with its shape."""
    rows = await conn.fetch(_SHAPES + " WHERE j.status IN ('Admitted', 'Queued') AND ($1::text IS NULL OR j.tenant = $1)",
                            tenant)
    return [PendingRow(r["tenant"] or "", r["gpus_per_node"] if r["nodes"] else r["gpus"] or 0, r["nodes"] or 1,
                       r["share_milli"], r["mig_profile"]) for r in rows]
