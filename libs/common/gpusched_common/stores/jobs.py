"""The jobs read model and the event store as readers see them (the CLI, the gateway): a job's history, and
every waiting job in the order the service it waits for considers it. Placement's and quota's queues are
read through their owners' store functions (``cluster.pending_jobs``, ``quota.quota_queue``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from gpusched_common import store
from gpusched_common.ids import job_stream
from gpusched_common.stores.cluster import pending_jobs
from gpusched_common.stores.quota import quota_queue

from gpusched_core.placement.cycle import order_pending


async def job_history(conn: asyncpg.Connection, job_id: str, after_version: int = 0) -> list[dict[str, Any]]:
    """The job's events in stream order (those after ``after_version``): version, type, producer, when,
    payload."""
    return [{"version": e.envelope.stream_version, "type": e.envelope.type, "producer": e.envelope.producer,
             "occurred_at": e.envelope.occurred_at, "payload": e.envelope.payload}
            for e in await store.load(conn, job_stream(job_id), after_version)]


@dataclass(frozen=True)
class Waiting:
    """A waiting job (``row``: job_id, tenant, status, gpus, gpu_model, priority, reasons, submitted_at), the
    queue it waits in (``capacity`` or ``quota/<cohort>``), its 1-based ``position`` there (None: no service
    has handled it yet), the waiting jobs of a higher priority ahead of it, and why it waits."""

    row: dict[str, Any]
    queue: str
    position: int | None
    ahead_higher_priority: int
    reason: str

    @property
    def waiting_for(self) -> str:
        return "quota" if self.queue.startswith("quota") else "capacity"


async def waiting_jobs(conn: asyncpg.Connection, now: datetime, tenant: str | None = None) -> list[Waiting]:
    """Every waiting job of ``tenant`` (None: all): first those holding quota that wait for capacity, in
    placement's order (priority, submission, arrival, id); then those waiting for quota, cohort by cohort in
    the quota cycle's fair-share order; then any whose event no service has handled yet, without a position.
    Positions count every tenant's jobs; ``tenant`` narrows only the job rows (in SQL)."""
    jobs = {r["job_id"]: dict(r) for r in await conn.fetch(
        "SELECT job_id, tenant, status, gpus, gpu_model, priority, reasons, submitted_at FROM jobs"
        " WHERE status IN ('Admitted', 'Queued') AND ($1::text IS NULL OR tenant = $1)", tenant)}
    out: list[Waiting] = []
    pending, _ = await pending_jobs(conn)
    placing = order_pending(pending)
    for position, (job, ahead) in enumerate(zip(placing, higher_ahead([j.priority for j in placing])), start=1):
        if (row := jobs.pop(job.job_id, None)) is not None:
            out.append(Waiting(row, "capacity", position, ahead, "; ".join(row["reasons"]) or "waiting for capacity"))
    for entry in await quota_queue(conn, now):
        if (row := jobs.pop(entry.job_id, None)) is not None:  # else reserved, ended or another tenant's
            out.append(Waiting(row, f"quota/{entry.cohort}", entry.position, entry.ahead_higher_priority,
                               entry.reason))
    for row in sorted(jobs.values(), key=lambda r: (-(r["priority"] or 0), r["submitted_at"] is None, r["job_id"])):
        stage = "quota" if row["status"] == "Admitted" else "capacity"
        out.append(Waiting(row, stage, None, 0, "; ".join(row["reasons"]) or f"waiting for {stage}"))
    return out


def higher_ahead(priorities: list[int]) -> list[int]:
    """For each job of a queue in order: how many jobs before it have a higher priority."""
    seen: dict[int, int] = {}
    out = []
    for priority in priorities:
        out.append(sum(n for other, n in seen.items() if other > priority))
        seen[priority] = seen.get(priority, 0) + 1
    return out
