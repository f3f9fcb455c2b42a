"""Read models for the CLI: job lists and a job's event history from the event store, and the queues
through the services' documented store functions (``gpusched_common.stores``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg

from gpusched_common.stores.cluster import counts as cluster_counts
from gpusched_common.stores.jobs import Waiting, job_history, waiting_jobs
from gpusched_common.stores.metrics import utilization_summary

_JOB_COLUMNS = ("job_id, tenant, status, gpus, gpu_model, priority, node_id, gpu_indices, exit_code, reasons,"
                " submitted_at, placed_at, started_at, finished_at")


async def get_job(conn: asyncpg.Connection, job_id: str, now: datetime | None = None) -> dict[str, Any] | None:
    """The job's row and event history; a waiting job also has ``waiting``: its queue, position and reason."""
    row = await conn.fetchrow(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1", job_id)
    if row is None:
        return None
    history = [{**e, "occurred_at": e["occurred_at"].isoformat()} for e in await job_history(conn, job_id)]
    job = {**_plain(dict(row)), "events": history}
    if row["status"] in ("Admitted", "Queued"):
        entry = next((w for w in await queue(conn, now=now) if w["job_id"] == job_id), None)
        if entry is not None:
            job["waiting"] = {k: entry[k] for k in ("queue", "position", "ahead_higher_priority", "reason")}
            job["waiting"]["describe"] = describe_wait(entry)
    return job


async def queue(conn: asyncpg.Connection, *, tenant: str | None = None,
                now: datetime | None = None) -> list[dict[str, Any]]:
    """Waiting jobs in the order the service each waits for considers it (``stores.jobs.waiting_jobs``),
    each with its ``queue``, ``position``, ``ahead_higher_priority``, ``waiting_for`` and ``reason``."""
    return [_waiting(w) for w in await waiting_jobs(conn, now or datetime.now(UTC), tenant)]


def _waiting(w: Waiting) -> dict[str, Any]:
    return {**_plain(w.row), "queue": w.queue, "position": w.position,
            "ahead_higher_priority": w.ahead_higher_priority, "waiting_for": w.waiting_for, "reason": w.reason}


def describe_wait(entry: dict[str, Any]) -> str:
    """``#3 in quota/local, behind 2 jobs of higher priority: tenant team-a at quota (...)``."""
    where = f"#{entry['position']} in {entry['queue']}" if entry["position"] else f"waiting for {entry['waiting_for']}"
    ahead = entry["ahead_higher_priority"]
    if ahead:
        where += f", behind {ahead} job{'s' if ahead != 1 else ''} of higher priority"
    return f"{where}: {entry['reason']}"


async def summary(conn: asyncpg.Connection) -> dict[str, Any]:
    by_state = {r["status"]: r["n"] for r in await conn.fetch("SELECT status, count(*) AS n FROM jobs GROUP BY 1")}
    latency = await conn.fetchrow(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, count(*) AS n FROM ("
        "  SELECT extract(epoch FROM placed_at - submitted_at) * 1000 AS ms FROM jobs"
        "  WHERE placed_at IS NOT NULL AND submitted_at IS NOT NULL) t")
    _, gpus_total = await cluster_counts(conn)
    # allocated GPU-seconds over capacity x the span from first submission to last finish
    alloc = await conn.fetchrow(
        "SELECT sum(gpus * extract(epoch FROM coalesce(finished_at, now()) - placed_at)) AS gpu_s,"
        " extract(epoch FROM max(coalesce(finished_at, now())) - min(submitted_at)) AS span_s"
        " FROM jobs WHERE placed_at IS NOT NULL")
    util = await utilization_summary(conn)
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
