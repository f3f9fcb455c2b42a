"""All of the gateway's SQL: the jobs read model and the event store (shared tables), scoped by tenant in
SQL with the tenant the access Decision gives (``None``: cluster-wide, for roles that may see it); other
rooms' data only through ``gpusched_common.stores``; tokens through ``gpusched_common.tokens``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from gpusched_common.stores import jobs

_JOB_COLUMNS = ("job_id, name, tenant, status AS state, gpus, gpu_model, priority, node_id, gpu_indices, exit_code,"
                " reasons, submitted_by, submitted_at, admitted_at, queued_at, placed_at, started_at, finished_at")
_SORT_AT = "coalesce(submitted_at, 'epoch'::timestamptz)"  # a job not yet submitted sorts oldest


async def ping(conn: asyncpg.Connection) -> None:
    await conn.fetchval("SELECT 1")


async def list_jobs(conn: asyncpg.Connection, *, tenant: str | None, state: str | None,
                    after: tuple[datetime, str] | None, limit: int, name: str | None = None,
                    since: datetime | None = None, until: datetime | None = None,
                    array: str | None = None) -> list[dict[str, Any]]:
    """Jobs newest first by ``(submitted_at, job_id)``, after the cursor ``after``, of that ``name`` and
    submitted in ``[since, until)``, tasks of the job ``array`` when given; one more than ``limit`` tells the caller whether another
    page follows."""
    after_at, after_id = after if after else (None, None)
    rows = await conn.fetch(
        f"SELECT {_JOB_COLUMNS}, {_SORT_AT} AS sort_at FROM jobs"
        " WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR status = $2)"
        f" AND ($3::timestamptz IS NULL OR ({_SORT_AT}, job_id) < ($3, $4::text))"
        " AND ($6::text IS NULL OR name = $6) AND ($7::timestamptz IS NULL OR submitted_at >= $7)"
        " AND ($8::timestamptz IS NULL OR submitted_at < $8)"
        " AND ($9::text IS NULL OR starts_with(job_id, $9 || '.'))"
        f" ORDER BY {_SORT_AT} DESC, job_id DESC LIMIT $5",
        tenant, state, after_at, after_id, limit + 1, name, since, until, array)
    return [dict(r) for r in rows]


async def job_states(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, str]:
    """The state of each of these jobs that exists (a retried submission answers with it)."""
    rows = await conn.fetch("SELECT job_id, status FROM jobs WHERE job_id = ANY($1::text[])", job_ids)
    return {r["job_id"]: r["status"] for r in rows}


async def job_tenants(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, str | None]:
    """The tenant of each of these jobs that exists."""
    rows = await conn.fetch("SELECT job_id, tenant FROM jobs WHERE job_id = ANY($1::text[])", job_ids)
    return {r["job_id"]: r["tenant"] for r in rows}


async def array_tasks(conn: asyncpg.Connection, array_id: str) -> list[dict[str, Any]]:
    """The tasks of a job array (jobs ``<array_id>.<index>``), in index order."""
    rows = await conn.fetch(
        "SELECT job_id, tenant, submitted_by, status AS state FROM jobs WHERE starts_with(job_id, $1 || '.')"
        " ORDER BY length(job_id), job_id", array_id)
    return [dict(r) for r in rows]


async def load_job(conn: asyncpg.Connection, job_id: str) -> dict[str, Any] | None:
    """The job's row (None: no such job); its tenant is what ``authorize`` judges before more is read."""
    row = await conn.fetchrow(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1", job_id)
    return dict(row) if row is not None else None


async def waiting_jobs(conn: asyncpg.Connection, tenant: str | None, now: datetime) -> list[dict[str, Any]]:
    """The waiting jobs of ``tenant`` (None: all) in queue order (``stores.jobs.waiting_jobs``), as the API
    names their fields."""
    out = []
    for w in await jobs.waiting_jobs(conn, now, tenant):
        row = {("state" if k == "status" else k): v for k, v in w.row.items()}
        out.append({**row, "queue": w.queue, "position": w.position,
                    "ahead_higher_priority": w.ahead_higher_priority, "reason": w.reason})
    return out



async def recorded_job_ids(pool: asyncpg.Pool, job_ids: list[str]) -> set[str]:
    """Which of these jobs the store has recorded (admitted or rejected): a submission the broker lost after
    that needs no publishing again."""
    rows = await pool.fetch("SELECT job_id FROM jobs WHERE job_id = ANY($1::text[])", job_ids)
    return {r["job_id"] for r in rows}


async def feed_tail(conn: asyncpg.Connection) -> tuple[int, int]:
    """The position (writing transaction, global position) of the last event every reader can see now: a
    change feed starts there (it tells what happens from now on, not the past)."""
    row = await conn.fetchrow(
        "SELECT transaction_id::text::bigint AS txid, global_position FROM events"
        " WHERE transaction_id < pg_snapshot_xmin(pg_current_snapshot())"
        " ORDER BY transaction_id DESC, global_position DESC LIMIT 1")
    return (row["txid"], row["global_position"]) if row is not None else (0, 0)


async def feed_after(conn: asyncpg.Connection, after: tuple[int, int], limit: int) -> list[dict[str, Any]]:
    """Events after ``after`` in the store's gap-free global order (``gpusched_common.store.read_all``'s
    rule), without their payloads: what the change feed tells browsers."""
    rows = await conn.fetch(
        "SELECT transaction_id::text::bigint AS txid, global_position, stream_id, type, tenant, recorded_at"
        " FROM events WHERE (transaction_id, global_position) > ($1::text::xid8, $2)"
        "   AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())"
        " ORDER BY transaction_id, global_position LIMIT $3", str(after[0]), after[1], limit)
    return [dict(r) for r in rows]
