"""Placement rebuilt from the store (issue 15, DESIGN.md principle 4): a periodic pass that settles what a
lost or skipped message left undone, so that a broker that lost everything, a consumer that skipped
records, or a command that never arrived strands no job and holds no GPU.

Each step considers only jobs whose stream has been still for ``settle_s`` (the messages in flight get
their turn first), and each is idempotent with the message it stands in for:

- a job Queued (quota reserved) that placement never queued (its QuotaReserved lost) is queued;
- a job queued for placement that no longer waits (cancelled or held, that message lost) is forgotten;
- GPUs held for a job the store says holds none (its stream ended or moved on without placement: a
  repair, another writer) are released and its nodes told to stop it;
- a job asked to cancel that still runs is told to stop again (its StopJob lost), once per ``resend_s``;
- a node whose own account of its jobs drifted from the store's is sent a ReconcileJobs
  (``gpusched_core.placement.drift``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import events as ev
from gpusched_common.jobs import load_job, load_jobs
from gpusched_core.lifecycle import HOLDS_GPUS, JobStatus
from gpusched_core.placement.cycle import bound_to_charge
from gpusched_core.placement.drift import NodeAccount, judge_drift, suspects

from services.placement import store
from services.placement.handlers import on_cancel_requested

log = logging.getLogger(__name__)

SETTLE_S = 10.0
_HOLDING = [s.value for s in HOLDS_GPUS]


@dataclass
class Recovered:
    queued: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)

    @property
    def cluster_changed(self) -> bool:
        """Whether the pass changed what a cycle's cluster holds (GPUs released, holds dropped with the jobs it
        forgot); the jobs it queued are read by the next cycle as any new job is (none weighed them yet)."""
        return bool(self.forgotten or self.released)

    def summary(self) -> str:
        parts = [f"{name} {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}"
                 for name, ids in vars(self).items() if ids]
        return "; ".join(parts)


async def recover(conn: asyncpg.Connection, now: datetime, *, resend_s: float, settle_s: float = SETTLE_S,
                  limit: int = 500, stops_sent: dict[str, datetime] | None = None, drift: bool = True) -> Recovered:
    """One pass, inside the caller's transaction (which holds the cycle lock). ``stops_sent``: when each
    cancelled job was last told to stop again (kept by the caller across passes; lost on restart, which
    costs one more StopJob). ``drift``: whether nodes' accounts are judged (not while placement is behind on
    their reports: an old account would look drifted)."""
    settled = now - timedelta(seconds=settle_s)
    done = Recovered()
    lost = await conn.fetch(  # in the order quota reserved them, as their messages would have queued them
        "SELECT j.job_id FROM jobs j WHERE j.status = 'Queued' AND j.updated_at < $1"
        " AND NOT EXISTS (SELECT 1 FROM placement_pending p WHERE p.job_id = j.job_id)"
        " AND NOT EXISTS (SELECT 1 FROM gpu_allocations a WHERE a.job_id = j.job_id)"
        " ORDER BY j.updated_at, j.job_id LIMIT $2", settled, limit)
    states = await load_jobs(conn, [row["job_id"] for row in lost])  # one query, one statement: the lock is held
    done.queued += await store.queue_many_if_waiting(conn, [
        (state.job_id, bound_to_charge(state.spec, state.charged_model)) for state in states.values()
        if state.status is JobStatus.QUEUED and state.spec is not None])
    for row in await conn.fetch(
            "SELECT p.job_id FROM placement_pending p JOIN jobs j ON j.job_id = p.job_id"
            " WHERE j.status <> 'Queued' AND j.updated_at < $1 LIMIT $2", settled, limit):
        await store.forget_pending(conn, row["job_id"])
        done.forgotten.append(row["job_id"])
    for row in await conn.fetch(
            "SELECT DISTINCT a.job_id FROM gpu_allocations a JOIN jobs j ON j.job_id = a.job_id"
            " WHERE NOT (j.status = ANY($1::text[])) AND j.updated_at < $2 LIMIT $3", _HOLDING, settled, limit):
        state = await load_job(conn, row["job_id"])
        await store.stop_on(conn, state.job_id, await store.release_gpus(conn, state.job_id),
                            f"the job is {state.status.value if state.status else 'gone'}", now,
                            attempt=state.runs or None)
        done.released.append(state.job_id)
    await _stop_cancelled(conn, now, resend_s, limit, done, {} if stops_sent is None else stops_sent)
    if drift:
        await _reconcile_drifted(conn, now, resend_s, done)
    return done


async def _stop_cancelled(conn: asyncpg.Connection, now: datetime, resend_s: float, limit: int,
                          done: Recovered, stops_sent: dict[str, datetime]) -> None:
    """Jobs asked to cancel that still hold GPUs ``resend_s`` after the ask (and after the last try): stop
    them again."""
    rows = await conn.fetch(
        "SELECT j.job_id FROM jobs j WHERE j.status = ANY($1::text[]) AND j.updated_at < $2 AND EXISTS ("
        " SELECT 1 FROM events e WHERE e.stream_id = 'job-' || j.job_id AND e.type = 'JobCancelRequested')"
        " LIMIT $3", _HOLDING, now - timedelta(seconds=resend_s), limit)
    still = {row["job_id"] for row in rows}
    for job_id in set(stops_sent) - still:
        del stops_sent[job_id]
    for job_id in sorted(still):
        last = stops_sent.get(job_id)
        if last is not None and now - last < timedelta(seconds=resend_s):
            continue
        state = await load_job(conn, job_id)
        if state.cancel is None:
            continue
        await on_cancel_requested(conn, state.cancel, now)  # as when it was asked: every node it runs on
        stops_sent[job_id] = now
        done.stops.append(job_id)


async def _reconcile_drifted(conn: asyncpg.Connection, now: datetime, resend_s: float, done: Recovered) -> None:
    rows = await conn.fetch(
        "SELECT n.node_id, n.lease_epoch, n.reported_jobs, n.reported_at, d.drift_since, d.reconciled_at,"
        " coalesce(array_agg(DISTINCT a.job_id) FILTER (WHERE a.job_id IS NOT NULL), '{}') AS expected,"
        " coalesce(array_agg(DISTINCT a.job_id) FILTER (WHERE a.job_id IS NOT NULL AND j.status <> 'Placed'"
        "   AND NOT EXISTS (SELECT 1 FROM placement_starts s WHERE s.job_id = a.job_id AND s.node_id = n.node_id)),"
        "   '{}') AS started"
        " FROM nodes n LEFT JOIN node_drift d ON d.node_id = n.node_id"
        " LEFT JOIN gpu_allocations a ON a.node_id = n.node_id LEFT JOIN jobs j ON j.job_id = a.job_id"
        " WHERE n.status = 'Ready' AND n.reported_jobs IS NOT NULL"
        " GROUP BY n.node_id, d.drift_since, d.reconciled_at")
    accounts = [NodeAccount(row["node_id"], frozenset(row["reported_jobs"]), frozenset(row["expected"]),
                            frozenset(row["started"]), row["drift_since"], row["reconciled_at"], row["reported_at"])
                for row in rows]
    suspected = sorted({job_id for account in accounts for job_id in suspects(account)})
    changed = dict(await conn.fetch("SELECT job_id, updated_at FROM jobs WHERE job_id = ANY($1::text[])",
                                    suspected)) if suspected else {}
    for row, account in zip(rows, accounts, strict=True):
        verdict = judge_drift(replace(account, changed_at=changed), now, resend_s)  # it looks up its suspects
        if not verdict.drifting:
            if row["drift_since"] is not None:
                await _drift(conn, row["node_id"], None, row["reconciled_at"])
            continue
        if not verdict.reconcile:
            if row["drift_since"] is None:
                await _drift(conn, row["node_id"], now, row["reconciled_at"])
            continue
        log.warning("node %s drifted from the store (runs %s unexpected, lacks %s): reconciling", row["node_id"],
                    list(verdict.unexpected)[:5], list(verdict.missing)[:5])
        expected = sorted(row["expected"])
        states = await load_jobs(conn, expected)  # one query (the cycle lock is held)
        attempts = {job_id: states[job_id].runs for job_id in expected}
        await store.send_command(conn, ev.ReconcileJobs(node_id=row["node_id"], job_ids=expected,
                                                        lease_epoch=row["lease_epoch"], attempts=attempts),
                                 row["node_id"], now)
        await _drift(conn, row["node_id"], None, now)
        done.reconciled.append(row["node_id"])


async def _drift(conn: asyncpg.Connection, node_id: str, since: datetime | None, reconciled: datetime | None) -> None:
    await conn.execute("INSERT INTO node_drift (node_id, drift_since, reconciled_at) VALUES ($1, $2, $3)"
                       " ON CONFLICT (node_id) DO UPDATE SET drift_since = $2, reconciled_at = $3",
                       node_id, since, reconciled)
