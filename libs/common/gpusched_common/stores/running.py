"""Who holds GPUs, as the preemption service weighs victims: each job placed, running or stopping, with its
tenant and what quota charges it (quota's reservation when there is one, else its tenant and whole GPUs
held), when it started and last checkpointed, and, while it stops, the job it stops for. Reads placement's
allocations and GPUs, quota's reservations and the job streams (their owners keep them; this is the one
documented read across them)."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_core import preemption as sel
from gpusched_core.preemption.jobs import quota_charge


async def load_running(conn: asyncpg.Connection) -> list[sel.RunningJob]:
    """Jobs holding GPUs, with the tenant and what quota charges them (``quota_charge``) and, while they
    stop, the job they stop for."""
    rows = await conn.fetch(
        "SELECT j.job_id, j.tenant, r.tenant AS reserved_tenant, j.priority, j.status,"
        " coalesce(j.started_at, j.placed_at) AS since,"
        " (SELECT max(e.occurred_at) FROM events e WHERE e.stream_id = job_stream(j.job_id)"
        "   AND e.type = 'JobCheckpointed' AND e.occurred_at >= coalesce(j.started_at, j.placed_at)) AS ckpt,"
        " r.flavor AS reserved_flavor, r.units AS reserved_units,"
        " (SELECT array_agg(DISTINCT g.model) FROM gpu_allocations a JOIN gpus g"
        "   ON g.node_id = a.node_id AND g.gpu_index = a.gpu_index WHERE a.job_id = j.job_id) AS models,"
        " (SELECT count(*) FROM gpu_allocations a WHERE a.job_id = j.job_id) AS held,"
        " CASE WHEN j.status = 'Preempting' THEN (SELECT e.payload->>'preemptor_job_id' FROM events e"
        "   WHERE e.stream_id = job_stream(j.job_id) AND e.type = 'PreemptionRequested'"
        "   ORDER BY e.version DESC LIMIT 1) END AS preempted_for"
        " FROM jobs j LEFT JOIN quota_policy_reservations r ON r.job_id = j.job_id"
        " WHERE j.status IN ('Placed', 'Running', 'Preempting')"
        "   AND EXISTS (SELECT 1 FROM gpu_allocations a WHERE a.job_id = j.job_id) ORDER BY j.job_id")
    running = []
    for r in rows:
        tenant, flavor, units = quota_charge(r["tenant"], r["held"], tuple(r["models"] or ()),
                                             reserved_tenant=r["reserved_tenant"], reserved_flavor=r["reserved_flavor"],
                                             reserved_units=r["reserved_units"])
        running.append(sel.RunningJob(r["job_id"], tenant, r["priority"], r["since"].timestamp(), (r["job_id"],),
                                      units=units, last_checkpoint_at_s=r["ckpt"].timestamp() if r["ckpt"] else None,
                                      preempting=r["status"] == "Preempting", flavor=flavor,
                                      preempted_for=r["preempted_for"]))
    return running


async def running_priorities(conn: asyncpg.Connection) -> tuple[int, int | None, int, datetime | None]:
    """Of the jobs holding GPUs (``load_running``'s): how many run, the lowest priority among them, how many
    are being preempted, and when the longest-running of those not being preempted (re)started; one query,
    no cycle lock."""
    row = await conn.fetchrow(
        "SELECT count(*) FILTER (WHERE status <> 'Preempting') AS running,"
        " min(priority) FILTER (WHERE status <> 'Preempting') AS lowest,"
        " count(*) FILTER (WHERE status = 'Preempting') AS stopping,"
        " min(coalesce(started_at, placed_at)) FILTER (WHERE status <> 'Preempting') AS oldest"
        " FROM jobs j WHERE j.status IN ('Placed', 'Running', 'Preempting')"
        " AND EXISTS (SELECT 1 FROM gpu_allocations a WHERE a.job_id = j.job_id)")
    return row["running"], row["lowest"], row["stopping"], row["oldest"]
