"""StartJobs re-sent until acknowledged (issue 15): placement keeps each StartJob it sends
(``placement_starts``, migration 027) until the node reports that run started; a periodic pass sends again
those of jobs still Placed (or a gang Running whose member on that node never started) whose node is Ready
and that went unanswered for ``resend_after_s`` (the command was lost: a broker restart that lost its data,
an agent that missed it). The agent runs a run once however often it is told (``gpusched_core.agent.start``:
a repeat is a duplicate) and answers a repeat of the run it has with its start again, so a lost report is
healed the same way."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import events as ev

from services.placement import store

log = logging.getLogger(__name__)


async def remember_many(conn: asyncpg.Connection, sent: list[ev.StartJob], now: datetime) -> None:
    """StartJobs sent: each is sent again until its node reports the run started (``acknowledged``)."""
    await conn.executemany(
        "INSERT INTO placement_starts (job_id, node_id, attempt, payload, sent_at) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (job_id, node_id) DO UPDATE SET attempt = EXCLUDED.attempt, payload = EXCLUDED.payload,"
        " sent_at = EXCLUDED.sent_at, resends = 0",
        [(start.job_id, start.node_id, start.attempt, start.model_dump(mode="json"), now) for start in sent])


async def forget_jobs(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    """The jobs are placed again: the StartJobs of their earlier runs are never to be sent again (the node of
    an earlier run that never acknowledged it has no record of the job and would start it beside the new run)."""
    await conn.execute("DELETE FROM placement_starts WHERE job_id = ANY($1::text[])", job_ids)


async def acknowledged_many(conn: asyncpg.Connection, reports: list[ev.JobStartReported]) -> None:
    """The nodes report these runs started: their StartJobs need no sending again (one statement)."""
    await conn.execute(
        "DELETE FROM placement_starts s USING unnest($1::text[], $2::text[], $3::int[]) AS r(job_id, node_id, attempt)"
        " WHERE s.job_id = r.job_id AND s.node_id = r.node_id AND s.attempt = r.attempt",
        [r.job_id for r in reports], [r.node_id for r in reports], [r.attempt or 1 for r in reports])


async def resend_unacknowledged(conn: asyncpg.Connection, now: datetime, resend_after_s: float) -> list[str]:
    """Send again the StartJobs unanswered for ``resend_after_s`` of jobs still placed on Ready nodes (each
    with its node's current epoch: a node that re-registered since runs it under the new one only if its
    ReconcileJobs lists it); forget those of jobs that moved on. Returns the jobs re-sent."""
    await conn.execute(  # a gang runs once one member started; a run's node holds the job's GPUs
        "DELETE FROM placement_starts s WHERE NOT EXISTS (SELECT 1 FROM jobs j JOIN gpu_allocations a"
        " ON a.job_id = j.job_id AND a.node_id = s.node_id WHERE j.job_id = s.job_id"
        " AND j.status IN ('Placed', 'Running'))")
    rows = await conn.fetch(
        "SELECT s.job_id, s.node_id, s.payload, n.lease_epoch FROM placement_starts s"
        " JOIN nodes n ON n.node_id = s.node_id AND n.status = 'Ready'"
        " WHERE s.sent_at < $1 ORDER BY s.sent_at LIMIT 500", now - timedelta(seconds=resend_after_s))
    for row in rows:
        start = ev.StartJob.model_validate(row["payload"])
        if start.lease_epoch != row["lease_epoch"]:
            continue  # placed under an epoch the node left: its ReconcileJobs settles the job
        await store.send_command(conn, start, row["node_id"], now)
        await conn.execute("UPDATE placement_starts SET sent_at = $3, resends = resends + 1"
                           " WHERE job_id = $1 AND node_id = $2", row["job_id"], row["node_id"], now)
    if rows:
        log.warning("re-sent the StartJob of %d placed job(s) no node acknowledged: %s", len(rows),
                    ", ".join(sorted({r["job_id"] for r in rows})[:10]))
    return [r["job_id"] for r in rows]
