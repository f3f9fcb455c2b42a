"""What the start-time estimator (``gpusched_core.estimates``) reads, as its values: the nodes that take
work and their healthy GPUs, the jobs holding GPUs (allocations, since when), the waiting jobs in queue
order (``stores.jobs.waiting_jobs``, shapes as the queue each waits in stores them), the runs that ended in
a window, and each job's time limit (its ``JobAdmitted`` spec, the tenancy's default applied). Placement's,
quota's and the jobs read model's tables and the event store; the gateway's role may read every one
(migration 017)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from gpusched_common.stores.dashboard import waiting_shapes
from gpusched_common.stores.jobs import Waiting, waiting_jobs

from gpusched_core.estimates import FinishedRun, Hold, NodeGpus, RunningJob, Shape, WaitingJob

ADMITTED = "JobAdmitted"  # gpusched_common.events.JobAdmitted.TYPE


@dataclass(frozen=True)
class EstimateInputs:
    """``queue``: every waiting job as ``stores.jobs`` lists it (queue, position, its row), in order;
    ``waiting``: the same jobs as the estimator's values, in the same order."""

    nodes: tuple[NodeGpus, ...]
    running: tuple[RunningJob, ...]
    queue: tuple[Waiting, ...]
    waiting: tuple[WaitingJob, ...]
    finished: tuple[FinishedRun, ...]


async def load_estimate_inputs(conn: asyncpg.Connection, now: datetime, history_s: float) -> EstimateInputs:
    """Everything of every tenant (the queue is one simulation); a reader narrows the answer, not this."""
    queue = tuple(await waiting_jobs(conn, now))
    ids = [w.row["job_id"] for w in queue]
    shapes = await waiting_shapes(conn, ids)
    running = await _running(conn)
    limits = await time_limits(conn, ids + [r["job_id"] for r in running])
    waiting = tuple(_waiting(w, shapes.get(w.row["job_id"], {}), limits.get(w.row["job_id"])) for w in queue)
    return EstimateInputs(await ready_nodes(conn),
                          tuple(RunningJob(r["job_id"], r["tenant"] or "", Shape(r["gpus"] or 1, 1, r["gpu_model"]),
                                           r["since"].timestamp(), tuple(Hold(*h) for h in r["holds"]),
                                           limits.get(r["job_id"])) for r in running),
                          queue, waiting, await finished_runs(conn, now - timedelta(seconds=history_s), now))


async def ready_nodes(conn: asyncpg.Connection) -> tuple[NodeGpus, ...]:
    """Ready, uncordoned nodes with their healthy GPUs (a node's first GPU names its model)."""
    rows = await conn.fetch(
        "SELECT g.node_id, min(g.model) AS model, array_agg(g.gpu_index ORDER BY g.gpu_index) AS indices"
        " FROM gpus g JOIN nodes n USING (node_id) WHERE n.status = 'Ready' AND n.cordoned_at IS NULL AND g.healthy"
        " GROUP BY g.node_id ORDER BY g.node_id")
    return tuple(NodeGpus(r["node_id"], r["model"], tuple(r["indices"])) for r in rows)


async def _running(conn: asyncpg.Connection) -> list[dict]:
    rows = await conn.fetch(
        "SELECT j.job_id, j.tenant, j.gpus, j.gpu_model, coalesce(j.started_at, j.placed_at, j.updated_at) AS since,"
        " array_agg(ARRAY[a.node_id, a.gpu_index::text, a.milli::text] ORDER BY a.node_id, a.gpu_index) AS holds"
        " FROM jobs j JOIN gpu_allocations a USING (job_id)"
        " WHERE j.status IN ('Placed', 'Running', 'Preempting') GROUP BY j.job_id ORDER BY j.job_id")
    return [{**dict(r), "holds": [(h[0], int(h[1]), int(h[2])) for h in r["holds"]]} for r in rows]


async def time_limits(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, float]:
    """Each job's time limit as admission recorded it (jobs without one are left out)."""
    rows = await conn.fetch(
        "SELECT j.job_id, (SELECT (e.payload->'spec'->>'time_limit_s')::float8 FROM events e"
        "  WHERE e.stream_id = job_stream(j.job_id) AND e.type = $2 ORDER BY e.version DESC LIMIT 1) AS limit_s"
        " FROM unnest($1::text[]) AS j(job_id)", job_ids, ADMITTED)
    return {r["job_id"]: r["limit_s"] for r in rows if r["limit_s"] is not None}


async def finished_runs(conn: asyncpg.Connection, since: datetime, until: datetime) -> tuple[FinishedRun, ...]:
    """Runs that ended (succeeded or failed) in ``[since, until]``: tenant, GPUs, model asked for, run-time."""
    rows = await conn.fetch(
        "SELECT tenant, gpus, gpu_model, extract(epoch FROM finished_at - started_at)::float8 AS runtime_s,"
        " extract(epoch FROM finished_at)::float8 AS finished_s FROM jobs"
        " WHERE status IN ('Succeeded', 'Failed') AND started_at IS NOT NULL AND finished_at >= $1"
        " AND finished_at <= $2", since, until)
    return tuple(FinishedRun(r["tenant"] or "", float(r["gpus"] or 1), r["gpu_model"], r["runtime_s"],
                             r["finished_s"]) for r in rows)


def _waiting(entry: Waiting, shape: dict, time_limit_s: float | None) -> WaitingJob:
    row = entry.row
    model = shape.get("gpu_model", row["gpu_model"])
    nodes = shape.get("nodes") or 1
    gpus = shape.get("gpus") or row["gpus"] or 1
    if nodes > 1:
        gpus = max(1, gpus // nodes)  # the jobs row counts a gang's GPUs over all its nodes
    spec = Shape(gpus, nodes, model, shape.get("share_milli"), shape.get("mig_profile"))
    submitted = row["submitted_at"].timestamp() if row["submitted_at"] else 0.0
    reserved = model if entry.queue == "capacity" and model else None
    return WaitingJob(row["job_id"], row["tenant"] or "", spec, submitted, row["priority"] or 0, entry.position,
                      time_limit_s, reserved)
