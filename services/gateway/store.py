"""All of the gateway's SQL: the jobs read model and the event store (shared tables), scoped by tenant in
SQL with the tenant the access Decision gives (``None``: cluster-wide, for roles that may see it); other
rooms' data only through ``gpusched_common.stores``; tokens through ``gpusched_common.tokens``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import asyncpg

from gpusched_common import store
from gpusched_common.ids import job_stream
from gpusched_common.stores.cluster import pending_jobs
from gpusched_common.stores.quota import quota_queue

from gpusched_core.placement.cycle import order_pending

SERVICE = "gateway"
_JOB_COLUMNS = ("job_id, tenant, status AS state, gpus, gpu_model, priority, node_id, gpu_indices, exit_code, reasons,"
                " submitted_at, admitted_at, queued_at, placed_at, started_at, finished_at")
_SORT_AT = "coalesce(submitted_at, 'epoch'::timestamptz)"  # a job not yet submitted sorts oldest


async def ping(conn: asyncpg.Connection) -> None:
    await conn.fetchval("SELECT 1")


async def list_jobs(conn: asyncpg.Connection, *, tenant: str | None, state: str | None,
                    after: tuple[datetime, str] | None, limit: int) -> list[dict[str, Any]]:
    """Jobs newest first by ``(submitted_at, job_id)``, after the cursor ``after``; one more than ``limit``
    tells the caller whether another page follows."""
    after_at, after_id = after if after else (None, None)
    rows = await conn.fetch(
        f"SELECT {_JOB_COLUMNS}, {_SORT_AT} AS sort_at FROM jobs"
        " WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR status = $2)"
        f" AND ($3::timestamptz IS NULL OR ({_SORT_AT}, job_id) < ($3, $4::text))"
        f" ORDER BY {_SORT_AT} DESC, job_id DESC LIMIT $5",
        tenant, state, after_at, after_id, limit + 1)
    return [dict(r) for r in rows]


async def job_tenant(conn: asyncpg.Connection, job_id: str) -> tuple[bool, str | None]:
    """(whether the job exists, its tenant): what ``authorize`` needs before anything else is read."""
    row = await conn.fetchrow("SELECT tenant FROM jobs WHERE job_id = $1", job_id)
    return (row is not None, row["tenant"] if row else None)


async def load_job(conn: asyncpg.Connection, job_id: str, tenant: str | None) -> dict[str, Any] | None:
    """The job's row and its event history, only when it is ``tenant``'s (None: any tenant's)."""
    row = await conn.fetchrow(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = $1"
                              " AND ($2::text IS NULL OR tenant = $2)", job_id, tenant)
    if row is None:
        return None
    events = [{"version": e.envelope.stream_version, "type": e.envelope.type, "producer": e.envelope.producer,
               "occurred_at": e.envelope.occurred_at, "payload": e.envelope.payload}
              for e in await store.load(conn, job_stream(job_id))]
    return {**dict(row), "events": events}


async def waiting_jobs(conn: asyncpg.Connection, tenant: str | None, now: datetime) -> list[dict[str, Any]]:
    """The waiting jobs of ``tenant`` (None: all), each in the order the service it waits for considers
    it: first those holding quota that wait for capacity (placement's order), then those waiting for quota,
    cohort by cohort (``stores.quota.quota_queue``), then any no service has handled yet (no position).
    Positions count every tenant's jobs; only the job rows are narrowed to ``tenant``."""
    jobs = {r["job_id"]: dict(r) for r in await conn.fetch(
        "SELECT job_id, tenant, status AS state, gpus, gpu_model, priority, reasons, submitted_at FROM jobs"
        " WHERE status IN ('Admitted', 'Queued') AND ($1::text IS NULL OR tenant = $1)", tenant)}
    out: list[dict[str, Any]] = []
    pending, _ = await pending_jobs(conn)
    for position, job in enumerate(order_pending(pending), start=1):
        if (row := jobs.pop(job.job_id, None)) is not None:
            out.append(_waiting(row, "capacity", position, "; ".join(row["reasons"]) or "waiting for capacity"))
    for entry in await quota_queue(conn, now):
        if (row := jobs.pop(entry.job_id, None)) is not None:
            out.append(_waiting(row, f"quota/{entry.cohort}", entry.position, entry.reason))
    for row in sorted(jobs.values(), key=lambda r: (-(r["priority"] or 0), r["submitted_at"] is None, r["job_id"])):
        stage = "quota" if row["state"] == "Admitted" else "capacity"
        out.append(_waiting(row, stage, None, "; ".join(row["reasons"]) or f"waiting for {stage}"))
    return out


def _waiting(row: dict[str, Any], queue: str, position: int | None, reason: str) -> dict[str, Any]:
    return {**row, "queue": queue, "position": position, "reason": reason}
