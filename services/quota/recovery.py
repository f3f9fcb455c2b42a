"""Quota rebuilt from the store (issue 15, DESIGN.md principle 4): a periodic pass that does what a lost or
skipped job event left undone, so that a broker that lost its data, or a consumer that skipped records,
neither strands a job nor keeps quota charged for one that ended.

Each step considers only jobs whose stream has been still for ``settle_s`` (messages in flight first) and
does exactly what the handler of the missing message would have:

- an Admitted job quota never queued (its JobAdmitted lost) goes in line, or waits for its dependencies;
- an Admitted job whose every dependency has ended (those messages lost) is judged again;
- a job that ended, was held or was preempted with quota still charged gives it back (a preempted job
  goes in line again to resume);
- a job in quota's line that no longer waits for quota (cancelled, held) leaves it.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import asyncpg

from gpusched_common.jobs import load_job
from gpusched_common.stores.tenancy import TenancyStore
from gpusched_core.lifecycle import TERMINAL, JobStatus
from gpusched_core.quota.jobs import queued_job

from services.quota import store, waits
from services.quota.charges import release

log = logging.getLogger(__name__)

SETTLE_S = 10.0
_GAVE_UP = [s.value for s in (*TERMINAL, JobStatus.HELD, JobStatus.PREEMPTED)]
_WAITS_FOR_QUOTA = [JobStatus.ADMITTED.value, JobStatus.PREEMPTED.value]


async def recover(conn: asyncpg.Connection, tenancies: TenancyStore, now: datetime, *, settle_s: float = SETTLE_S,
                  limit: int = 500) -> dict[str, list[str]]:
    """One pass in the caller's transaction; the jobs each step acted on, by step."""
    settled = now - timedelta(seconds=settle_s)
    done: dict[str, list[str]] = {"queued": [], "released": [], "unqueued": []}
    tenancy = await tenancies.current(conn)
    for row in await conn.fetch(
            "SELECT r.job_id FROM quota_policy_reservations r JOIN jobs j ON j.job_id = r.job_id"
            " WHERE j.status = ANY($1::text[]) AND j.updated_at < $2 LIMIT $3", _GAVE_UP, settled, limit):
        job_id = row["job_id"]
        await release(conn, tenancy, job_id, now)
        state = await load_job(conn, job_id)
        if state.status is JobStatus.PREEMPTED and state.spec is not None:  # as on JobPreempted: in line again
            await store.queue_job(conn, queued_job(job_id, state.spec, now.timestamp()), state.spec.array)
        done["released"].append(job_id)
    for row in await conn.fetch(
            "SELECT p.job_id FROM quota_policy_pending p JOIN jobs j ON j.job_id = p.job_id"
            " WHERE NOT (j.status = ANY($1::text[])) AND j.updated_at < $2 LIMIT $3", _WAITS_FOR_QUOTA, settled, limit):
        await release(conn, tenancy, row["job_id"], now)  # leaves the line (and gives back what it held)
        done["unqueued"].append(row["job_id"])
    for row in await conn.fetch(
            "SELECT j.job_id FROM jobs j WHERE j.status = ANY($1::text[]) AND j.updated_at < $2"
            " AND NOT EXISTS (SELECT 1 FROM quota_policy_pending p WHERE p.job_id = j.job_id)"
            " AND NOT EXISTS (SELECT 1 FROM quota_policy_reservations r WHERE r.job_id = j.job_id)"
            " AND (NOT EXISTS (SELECT 1 FROM quota_job_dependencies d WHERE d.job_id = j.job_id)"
            "      OR NOT EXISTS (SELECT 1 FROM quota_job_dependencies d JOIN jobs w ON w.job_id = d.depends_on"
            "                     WHERE d.job_id = j.job_id AND NOT (w.status = ANY($3::text[]))))"
            " LIMIT $4", _WAITS_FOR_QUOTA, settled, [s.value for s in TERMINAL], limit):
        state = await load_job(conn, row["job_id"])
        if state.status not in (JobStatus.ADMITTED, JobStatus.PREEMPTED) or state.spec is None \
                or state.submitted_at is None:
            continue
        if state.status is JobStatus.ADMITTED and not await waits.ready_to_queue(conn, state, now):
            continue  # waits for its dependencies (recorded now), or can never run (cancelled now)
        queued_at = state.submitted_at.timestamp() if state.status is JobStatus.ADMITTED else now.timestamp()
        await store.queue_job(conn, queued_job(state.job_id, state.spec, queued_at), state.spec.array)
        done["queued"].append(state.job_id)
    if any(done.values()):
        log.warning("quota recovered from the store: %s",
                    "; ".join(f"{k} {', '.join(v[:5])}" for k, v in done.items() if v))
    return done
