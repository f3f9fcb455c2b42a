"""All of quota's SQL but its read side (``gpusched_common.stores.quota``): tenancy revisions, usage rows
locked per cohort, decayed history, reservations, pending jobs, reclaims sent.

Every write to a tenant's usage or history happens while its cohort's usage rows are held ``FOR UPDATE``
(``lock_usage``), so a decision always sees the cohort as the last one left it, whichever process made it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common.stores.quota import read_usage
from gpusched_common.stores.tenancy import TENANCY_LOCK

from gpusched_core.arrays import WaitingTask
from gpusched_core.quota import Tenancy, UsageHistory
from gpusched_core.quota.jobs import QueuedJob, limit_units, limits_in_force
from gpusched_core.quota.reclaims import SentReclaim


class QuotaOvershoot(RuntimeError):
    """A charge the database refused: the decision was made on stale usage (never expected)."""


async def ensure_usage_rows(conn: asyncpg.Connection, tenancy: Tenancy, tenants: Iterable[str]) -> None:
    """Create missing (tenant, flavor) rows with their limits; existing rows are left untouched."""
    keys = [(t, f) for t in sorted(tenants) if t in tenancy.tenants for f in tenancy.flavors]
    if keys:
        await conn.execute(
            "INSERT INTO quota_policy_usage (tenant, flavor, limit_units, nominal_units)"
            " SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) ON CONFLICT DO NOTHING",
            *_limit_columns(tenancy, keys))


async def apply_limits(conn: asyncpg.Connection, tenancy: Tenancy) -> None:
    """Write every usage row's limits as ``limits_in_force`` decides them (the caller holds the tenancy lock
    exclusively, so no charge runs meanwhile)."""
    held = {(r["tenant"], r["flavor"]): r["reserved_units"]
            for r in await conn.fetch("SELECT tenant, flavor, reserved_units FROM quota_policy_usage FOR UPDATE")}
    rows = limits_in_force(tenancy, held)
    await conn.execute(
        "INSERT INTO quota_policy_usage (tenant, flavor, limit_units, nominal_units)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) ON CONFLICT (tenant, flavor)"
        " DO UPDATE SET nominal_units = EXCLUDED.nominal_units, limit_units = EXCLUDED.limit_units",
        [r.tenant for r in rows], [r.flavor for r in rows], [r.limit_units for r in rows],
        [r.nominal_units for r in rows])


def _limit_columns(tenancy: Tenancy, keys: list[tuple[str, str]]) -> tuple[list, list, list, list]:
    return ([t for t, _ in keys], [f for _, f in keys], [limit_units(tenancy, t, f) for t, f in keys],
            [tenancy.nominal_units(t, f) for t, f in keys])


async def lock_usage(conn: asyncpg.Connection, tenancy: Tenancy, members: tuple[str, ...]) -> dict[str, dict[str, int]]:
    """Reserved units per tenant per flavor of a cohort, its rows locked until the transaction ends.
    Locked in (tenant, flavor) order so that two processes taking the same cohort never deadlock."""
    await ensure_usage_rows(conn, tenancy, members)
    return await read_usage(conn, members, lock=True)


async def charge(conn: asyncpg.Connection, tenant: str, flavor: str, units: int) -> int:
    """Add (or, negative, give back) units to one row; the new total. The guard repeats the CHECK so that a
    charge over the limit fails loudly here rather than as a bare constraint violation."""
    total = (await _add_units(conn, {(tenant, flavor): units})).get((tenant, flavor))
    if total is None:
        raise QuotaOvershoot(f"charging {units} units of {flavor} to {tenant} would break its limit")
    return total


async def charge_many(conn: asyncpg.Connection, charges: list[tuple[str, str, int]],
                      expected: dict[tuple[str, str], int]) -> None:
    """``charge`` for several (tenant, flavor, units), summed per row, in one statement. ``expected``: each
    row's total afterwards as the caller worked it out from the rows it holds locked; a row the guard
    refuses, or one whose total differs, raises ``QuotaOvershoot`` (the decision was made on stale usage)."""
    summed: dict[tuple[str, str], int] = {}
    for tenant, flavor, units in charges:
        summed[(tenant, flavor)] = summed.get((tenant, flavor), 0) + units
    if not summed:
        return
    totals = await _add_units(conn, summed)
    for key in sorted(summed):
        if totals.get(key) != expected[key]:
            raise QuotaOvershoot(f"charging {summed[key]} units of {key[1]} to {key[0]} would break its limit or "
                                 f"was decided on stale usage (now {totals.get(key)}, expected {expected[key]})")


async def _add_units(conn: asyncpg.Connection, units: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Add units to (tenant, flavor) rows in one statement, the guard repeating the CHECK; the new totals of
    the rows it changed (a row the guard refuses is missing)."""
    keys = sorted(units)  # the rows' lock order
    rows = await conn.fetch(
        "UPDATE quota_policy_usage u SET reserved_units = u.reserved_units + c.units"
        " FROM unnest($1::text[], $2::text[], $3::bigint[]) AS c(tenant, flavor, units)"
        " WHERE u.tenant = c.tenant AND u.flavor = c.flavor AND u.reserved_units + c.units >= 0"
        " AND (u.limit_units IS NULL OR u.reserved_units + c.units <= u.limit_units)"
        " RETURNING u.tenant, u.flavor, u.reserved_units",
        [t for t, _ in keys], [f for _, f in keys], [units[k] for k in keys])
    return {(r["tenant"], r["flavor"]): r["reserved_units"] for r in rows}


async def save_histories(conn: asyncpg.Connection, histories: dict[str, UsageHistory]) -> None:
    tenants = sorted(histories)
    await conn.execute(
        "INSERT INTO quota_policy_history (tenant, as_of_s, geq_s)"
        " SELECT t, a, g::jsonb FROM unnest($1::text[], $2::float8[], $3::text[]) AS h(t, a, g)"
        " ON CONFLICT (tenant) DO UPDATE SET as_of_s = EXCLUDED.as_of_s, geq_s = EXCLUDED.geq_s",
        tenants, [histories[t].as_of_s for t in tenants], [json.dumps(dict(histories[t].geq_s)) for t in tenants])


async def save_history(conn: asyncpg.Connection, tenant: str, history: UsageHistory) -> None:
    await save_histories(conn, {tenant: history})


async def record_reservation(conn: asyncpg.Connection, job_id: str, tenant: str, flavor: str, units: int) -> None:
    """The job's charge (with its array, from its waiting row, so that the array's cap can count it)."""
    await record_reservations(conn, [(job_id, tenant, flavor, units)])


async def record_reservations(conn: asyncpg.Connection, reservations: list[tuple[str, str, str, int]]) -> None:
    """``record_reservation`` for several (job_id, tenant, flavor, units), in two statements."""
    if not reservations:
        return
    job_ids = [r[0] for r in reservations]
    await conn.execute(
        "INSERT INTO quota_policy_reservations (job_id, tenant, flavor, units, array_id)"
        " SELECT r.job_id, r.tenant, r.flavor, r.units, p.array_id"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS r(job_id, tenant, flavor, units)"
        " LEFT JOIN quota_policy_pending p ON p.job_id = r.job_id",
        job_ids, [r[1] for r in reservations], [r[2] for r in reservations], [r[3] for r in reservations])
    await unqueue_jobs(conn, job_ids)


async def load_reservations(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, asyncpg.Record]:
    """The charges on record of these jobs (tenant, flavor, units), in one query."""
    if not job_ids:
        return {}
    return {row["job_id"]: row for row in await conn.fetch(
        "SELECT job_id, tenant, flavor, units FROM quota_policy_reservations WHERE job_id = ANY($1::text[])", job_ids)}


async def forget_reservations(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    if job_ids:
        await conn.execute("DELETE FROM quota_policy_reservations WHERE job_id = ANY($1::text[])", job_ids)


async def queue_job(conn: asyncpg.Connection, job: QueuedJob, array: ev.ArrayTask | None = None) -> None:
    await queue_jobs(conn, [(job, array)])


async def queue_jobs(conn: asyncpg.Connection, jobs: list[tuple[QueuedJob, ev.ArrayTask | None]]) -> None:
    """Jobs into quota's line (one statement; a job already in it stays as it is)."""
    if not jobs:
        return
    columns = [[getattr(job, name) for job, _ in jobs] for name in
               ("job_id", "tenant", "gpus", "gpu_model", "priority", "queued_at_s", "nodes", "share_milli",
                "mig_profile")]
    columns += [[getattr(array, name) if array else None for _, array in jobs]
                for name in ("array_id", "index", "max_running")]
    await conn.execute(
        "INSERT INTO quota_policy_pending (job_id, tenant, gpus, gpu_model, priority, queued_at_s, nodes,"
        " share_milli, mig_profile, array_id, array_index, array_max_running)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::int[], $6::float8[], $7::int[],"
        " $8::int[], $9::text[], $10::text[], $11::int[], $12::int[]) ON CONFLICT DO NOTHING", *columns)


async def capped_tasks(conn: asyncpg.Connection, tenants: tuple[str, ...]) -> list[WaitingTask]:
    """The waiting tasks of capped arrays among ``tenants``' queue."""
    rows = await conn.fetch(
        "SELECT job_id, array_id, array_index, array_max_running FROM quota_policy_pending"
        " WHERE tenant = ANY($1::text[]) AND array_max_running IS NOT NULL", list(tenants))
    return [WaitingTask(r["job_id"], r["array_id"], r["array_index"], r["array_max_running"]) for r in rows]


async def active_tasks(conn: asyncpg.Connection, array_ids: list[str]) -> dict[str, int]:
    """How many tasks of each array hold quota (Queued, Placed or Running)."""
    rows = await conn.fetch("SELECT array_id, count(*) AS n FROM quota_policy_reservations"
                            " WHERE array_id = ANY($1::text[]) GROUP BY array_id", array_ids)
    return {r["array_id"]: r["n"] for r in rows}


# --- dependencies ---------------------------------------------------------------------------------------
DEPENDENCY_LOCKS = 7301  # advisory lock class: one lock per job others wait for


async def lock_dependencies(conn: asyncpg.Connection, job_ids: Iterable[str]) -> None:
    """Hold, until the transaction ends, a lock per job id (sorted, so two holders never cross): whoever
    judges a dependant and whoever handles that dependency's end take turns, and neither misses the other."""
    await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext(id)) FROM"
                       " (SELECT DISTINCT unnest($2::text[]) AS id ORDER BY 1) AS ids", DEPENDENCY_LOCKS,
                       sorted(set(job_ids)))


async def record_waits(conn: asyncpg.Connection, job_id: str, on: Iterable[str]) -> None:
    await conn.execute("DELETE FROM quota_job_dependencies WHERE job_id = $1", job_id)
    await conn.execute("INSERT INTO quota_job_dependencies (job_id, depends_on) SELECT $1, unnest($2::text[])"
                       " ON CONFLICT DO NOTHING", job_id, sorted(set(on)))


async def forget_waits(conn: asyncpg.Connection, job_id: str) -> None:
    await conn.execute("DELETE FROM quota_job_dependencies WHERE job_id = $1", job_id)


async def dependants(conn: asyncpg.Connection, job_ids: list[str]) -> list[str]:
    """The jobs waiting for any of ``job_ids``, each once."""
    return [r["job_id"] for r in await conn.fetch(
        "SELECT DISTINCT job_id FROM quota_job_dependencies WHERE depends_on = ANY($1::text[]) ORDER BY job_id",
        job_ids)]


async def unqueue_jobs(conn: asyncpg.Connection, job_ids: list[str]) -> None:
    if job_ids:
        await conn.execute("DELETE FROM quota_policy_pending WHERE job_id = ANY($1::text[])", job_ids)


async def set_last_reasons(conn: asyncpg.Connection, reasons: list[tuple[str, str]], now_s: float) -> None:
    """Each job's reason, as recorded in its stream at ``now_s`` (several jobs, one statement)."""
    if reasons:
        await conn.execute("UPDATE quota_policy_pending p SET last_reason = r.reason, last_reason_at_s = $3"
                           " FROM unnest($1::text[], $2::text[]) AS r(job_id, reason) WHERE p.job_id = r.job_id",
                           [j for j, _ in reasons], [r for _, r in reasons], now_s)


async def load_sent_reclaims(conn: asyncpg.Connection, tenants: tuple[str, ...]) -> dict[tuple[str, str], SentReclaim]:
    """The last reclaim sent for each (tenant, flavor) of ``tenants``."""
    rows = await conn.fetch(
        "SELECT DISTINCT ON (tenant, flavor) tenant, flavor, for_jobs, requested_at FROM quota_reclaims"
        " WHERE tenant = ANY($1::text[]) ORDER BY tenant, flavor, requested_at DESC", list(tenants))
    return {(r["tenant"], r["flavor"]): SentReclaim(frozenset(r["for_jobs"]), r["requested_at"].timestamp())
            for r in rows}


async def record_reclaim(conn: asyncpg.Connection, event_id: str, request: ev.ReclaimRequested, units: int) -> None:
    await conn.execute(
        "INSERT INTO quota_reclaims (event_id, tenant, cohort, flavor, units, for_jobs, borrowers, reason,"
        " requested_at) VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9)",
        event_id, request.tenant, request.cohort, request.flavor, units, request.for_jobs,
        [b.model_dump() for b in request.borrowers], request.reason, request.requested_at)


async def lock_revisions(conn: asyncpg.Connection) -> int | None:
    """Take the tenancy lock exclusively until the transaction ends; the revision in force (None: none)."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", TENANCY_LOCK)
    return await conn.fetchval("SELECT max(revision) FROM quota_tenancy_revisions")


async def install(conn: asyncpg.Connection, tenancy: Tenancy, document: str, *, source: str,
                  event_id: str | None, now: datetime) -> None:
    """Put ``tenancy`` in force and write its limits. The caller holds ``lock_revisions`` and has checked
    that the revision is newer than the one in force."""
    await conn.execute(
        "INSERT INTO quota_tenancy_revisions (revision, document, source, event_id, applied_at)"
        " VALUES ($1, $2, $3, $4, $5)", tenancy.revision, document, source, event_id, now)
    await apply_limits(conn, tenancy)


async def record_rejection(conn: asyncpg.Connection, *, event_id: str, revision: int | None, source: str | None,
                           problems: tuple[str, ...], now: datetime) -> None:
    await conn.execute(
        "INSERT INTO quota_tenancy_rejections (event_id, revision, source, problems, rejected_at)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING", event_id, revision, source, list(problems), now)
