"""Read models for the CLI: job lists and a job's event history, straight from the store."""

from __future__ import annotations

from typing import Any

import asyncpg

from gpusched_common import store
from gpusched_common.ids import job_stream

_JOB_COLUMNS = ("job_id, tenant, status, gpus, gpu_model, priority, node_id, gpu_indices, exit_code, reasons,"
                " submitted_at, placed_at, started_at, finished_at")


async def list_jobs(conn: asyncpg.Connection, *, status: str | None = None, tenant: str | None = None,
                    limit: int = 50) -> list[dict[str, Any]]:
    rows = await conn.fetch(
        f"SELECT {_JOB_COLUMNS} FROM jobs WHERE ($1::text IS NULL OR status = $1)"
        " AND ($2::text IS NULL OR tenant = $2) ORDER BY submitted_at DESC NULLS LAST, job_id LIMIT $3",
        status, tenant, limit)
    return [_plain(dict(r)) for r in rows]


async def get_job(conn: asyncpg.Connection, job_id: str) -> dict[str, Any] | None:
    row = await conn.fetchrow(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1", job_id)
    if row is None:
        return None
    history = [
        {"version": e.envelope.stream_version, "type": e.envelope.type, "producer": e.envelope.producer,
         "occurred_at": e.envelope.occurred_at.isoformat(), "payload": e.envelope.payload}
        for e in await store.load(conn, job_stream(job_id))
    ]
    return {**_plain(dict(row)), "events": history}


async def queue(conn: asyncpg.Connection, *, tenant: str | None = None) -> list[dict[str, Any]]:
    """Waiting jobs in the order they are considered (priority, then submission, then id), each with its
    position, how many jobs of higher priority are ahead, and its latest reason."""
    rows = await conn.fetch(
        "SELECT job_id, tenant, status, gpus, gpu_model, priority, reasons, submitted_at FROM jobs"
        " WHERE status IN ('Admitted', 'Queued') ORDER BY priority DESC, submitted_at, job_id")
    out = []
    for position, r in enumerate(rows, start=1):
        if tenant is not None and r["tenant"] != tenant:
            continue
        ahead = sum(1 for other in rows[:position - 1] if other["priority"] > r["priority"])
        waiting_for = "quota" if r["status"] == "Admitted" else "capacity"
        reason = "; ".join(r["reasons"]) or f"waiting for {waiting_for}"
        out.append({**_plain(dict(r)), "position": position, "ahead_higher_priority": ahead,
                    "waiting_for": waiting_for, "reason": reason})
    return out


async def summary(conn: asyncpg.Connection) -> dict[str, Any]:
    by_state = {r["status"]: r["n"] for r in await conn.fetch("SELECT status, count(*) AS n FROM jobs GROUP BY 1")}
    latency = await conn.fetchrow(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, count(*) AS n FROM ("
        "  SELECT extract(epoch FROM placed_at - submitted_at) * 1000 AS ms FROM jobs"
        "  WHERE placed_at IS NOT NULL AND submitted_at IS NOT NULL) t")
    gpus_total = await conn.fetchval("SELECT count(*) FROM gpus")
    # allocated GPU-seconds over capacity x the span from first submission to last finish
    alloc = await conn.fetchrow(
        "SELECT sum(gpus * extract(epoch FROM coalesce(finished_at, now()) - placed_at)) AS gpu_s,"
        " extract(epoch FROM max(coalesce(finished_at, now())) - min(submitted_at)) AS span_s"
        " FROM jobs WHERE placed_at IS NOT NULL")
    util = await conn.fetchrow(
        "SELECT avg(mean_utilization) AS mean, max(gpus_busy) AS peak_busy FROM cluster_utilization"
        " WHERE gpus_busy > 0")
    return {
        "jobs_by_state": by_state,
        "jobs": sum(by_state.values()),
        "gpus_total": gpus_total,
        "gpu_allocation_pct": round(100 * alloc["gpu_s"] / (gpus_total * alloc["span_s"]), 1)
        if gpus_total and alloc["gpu_s"] and alloc["span_s"] else None,
        "gpu_utilization_telemetry_pct": round(100 * util["mean"], 1) if util["mean"] is not None else None,
        "gpus_busy_peak": util["peak_busy"],
        "submit_to_placed_p50_ms": round(latency["p50"], 1) if latency["p50"] is not None else None,
        "submit_to_placed_p99_ms": round(latency["p99"], 1) if latency["p99"] is not None else None,
        "placed_jobs": latency["n"],
    }


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        out[key] = value
    return out
