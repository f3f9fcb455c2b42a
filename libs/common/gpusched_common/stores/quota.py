"""Quota's tables, read side: usage, decayed history, the jobs waiting for quota and where each stands.
The quota service owns ``quota_policy_*`` and decides with these reads (under its locks); other rooms
(the CLI, the preemption service) read quota's state only through these functions, without its locks: a
reader never delays a decision.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

import asyncpg

from gpusched_common import events as ev
from gpusched_common.stores.tenancy import TenancyStore

from gpusched_core.quota import UNITS_PER_GPU, BlockedWork, Tenancy, UsageHistory
from gpusched_core.quota.jobs import (
    QueuedJob,
    chargeable,
    cohort_members,
    cohort_names,
    cohort_of,
    priority_class_for,
    takes_guests,
)
from gpusched_core.quota.positions import QuotaQueueEntry, rank_cohort


async def read_usage(conn: asyncpg.Connection, members: tuple[str, ...], *,
                     lock: bool = False) -> dict[str, dict[str, int]]:
    """Reserved units per tenant per flavor (missing rows: none); without ``lock``, for a reader."""
    rows = await conn.fetch(
        "SELECT tenant, flavor, reserved_units FROM quota_policy_usage WHERE tenant = ANY($1::text[])"
        " ORDER BY tenant, flavor" + (" FOR UPDATE" if lock else ""), list(members))
    usage: dict[str, dict[str, int]] = {}
    for row in rows:
        if row["reserved_units"]:
            usage.setdefault(row["tenant"], {})[row["flavor"]] = row["reserved_units"]
    return usage


async def load_history(conn: asyncpg.Connection, tenants: tuple[str, ...]) -> dict[str, UsageHistory]:
    rows = await conn.fetch("SELECT tenant, as_of_s, geq_s FROM quota_policy_history WHERE tenant = ANY($1::text[])",
                            list(tenants))
    return {r["tenant"]: UsageHistory(r["as_of_s"], MappingProxyType(r["geq_s"])) for r in rows}


QUEUE_READ_ROWS = 2000  # rows a transaction's read of a queue holds at once (the rest are its jobs already read)


async def load_queued(conn: asyncpg.Connection, tenants: tuple[str, ...],
                      all_known: tuple[str, ...] | None = None) -> list[QueuedJob]:
    """Jobs waiting for quota of ``tenants``, and, given ``all_known``, of every tenant not in it (guests).

    A cycle reads its cohort's whole queue: inside a transaction (every cycle) the rows come through a
    cursor, ``QUEUE_READ_ROWS`` at a time (one round trip for a queue that size or smaller), so a backlog
    of tens of thousands is never held twice over, as rows and as jobs; and the strings a queue repeats
    (tenants, models, the reasons thousands of waiting jobs share) and the times a batch recorded reasons
    at are kept once each."""
    query = ("SELECT job_id, tenant, gpus, gpu_model, priority, queued_at_s, last_reason, nodes, share_milli,"
             " mig_profile, last_reason_at_s"  # QueuedJob's fields, in order
             " FROM quota_policy_pending WHERE tenant = ANY($1::text[])"
             " OR ($2::text[] IS NOT NULL AND NOT tenant = ANY($2::text[]))")
    args = (list(tenants), list(all_known) if all_known is not None else None)
    once = {}.setdefault
    if not conn.is_in_transaction():  # a reader's one-off listing
        return [_queued(row, once) for row in await conn.fetch(query, *args)]
    return [_queued(row, once) async for row in conn.cursor(query, *args, prefetch=QUEUE_READ_ROWS)]


def _queued(row: asyncpg.Record, once: Callable) -> QueuedJob:
    job_id, tenant, gpus, model, priority, queued_at_s, reason, nodes, share_milli, mig, reason_at = row
    return QueuedJob(job_id, once(tenant, tenant), gpus, once(model, model), priority, queued_at_s,
                     once(reason, reason), nodes, share_milli, once(mig, mig), once(reason_at, reason_at))


async def load_cohort_queue(conn: asyncpg.Connection, tenancy: Tenancy, cohort: str) -> list[QueuedJob]:
    """Jobs waiting for quota in ``cohort``: those of its tenants (organisations included) and, when the
    cohort is charged for guests, those of every tenant the tenancy does not name."""
    guests = tuple(tenancy.tenants) if takes_guests(tenancy, cohort) else None
    return await load_queued(conn, cohort_names(tenancy, cohort), guests)


async def blocked_work(conn: asyncpg.Connection, tenancy: Tenancy, members: tuple[str, ...]) -> list[BlockedWork]:
    """The work of ``members`` that quota reserved and placement deferred (it waits for room on the nodes),
    one per (tenant, flavor, priority), the priority as its class's value (as a cycle compares a job's); only
    shapes that some ready, uncordoned node could host were it empty (a job no node could ever take holds
    nobody back). What fair backfill holds others back for (``gpusched_core.quota.backfill``)."""
    rows = await conn.fetch(
        "WITH shapes AS ("
        "  SELECT DISTINCT r.tenant, r.flavor, p.priority, p.gpus, p.gpu_model, coalesce(p.nodes, 1) AS nodes"
        "  FROM quota_policy_reservations r JOIN placement_pending p USING (job_id)"
        "  WHERE r.tenant = ANY($1::text[]) AND p.last_reasons IS NOT NULL),"
        " hosts AS MATERIALIZED ("
        "  SELECT g.model, count(*) AS gpus FROM gpus g JOIN nodes n USING (node_id)"
        "  WHERE n.status = 'Ready' AND n.cordoned_at IS NULL AND g.healthy GROUP BY g.node_id, g.model)"
        " SELECT DISTINCT s.tenant, s.flavor, s.priority FROM shapes s"
        " WHERE (SELECT count(*) FROM hosts h WHERE (s.gpu_model IS NULL OR h.model = s.gpu_model)"
        "        AND h.gpus >= s.gpus) >= s.nodes", list(members))
    classes = tenancy.priority_classes
    return [BlockedWork(r["tenant"], r["flavor"], classes[priority_class_for(tenancy, r["priority"])]) for r in rows]


async def reservations_of(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, tuple[str, str, int]]:
    """Each of these jobs' quota reservation, (tenant, flavor, units), by job id (those that hold one)."""
    rows = await conn.fetch("SELECT job_id, tenant, flavor, units FROM quota_policy_reservations"
                            " WHERE job_id = ANY($1::text[])", job_ids)
    return {r["job_id"]: (r["tenant"], r["flavor"], r["units"]) for r in rows}


async def waiting_demand(conn: asyncpg.Connection, tenancy: Tenancy, cohort: str) -> dict[tuple[str, str], int]:
    """The units the jobs waiting for quota in ``cohort`` ask for (their first option), per (tenant charged,
    flavor): counted by shape in the store, each shape converted once (a queue of tens of thousands is a few
    rows here). A request quota cannot charge at all asks for nothing."""
    guests = tuple(tenancy.tenants) if takes_guests(tenancy, cohort) else None
    rows = await conn.fetch(
        "SELECT tenant, gpus, gpu_model, priority, nodes, share_milli, mig_profile, count(*) AS jobs"
        " FROM quota_policy_pending WHERE tenant = ANY($1::text[])"
        " OR ($2::text[] IS NOT NULL AND NOT tenant = ANY($2::text[]))"
        " GROUP BY tenant, gpus, gpu_model, priority, nodes, share_milli, mig_profile",
        list(cohort_names(tenancy, cohort)), list(guests) if guests is not None else None)
    demand: dict[tuple[str, str], int] = {}
    for r in rows:
        shape = QueuedJob("shape", r["tenant"], r["gpus"], r["gpu_model"], r["priority"], 0.0, None, r["nodes"],
                          r["share_milli"], r["mig_profile"])
        for job in chargeable(tenancy, [shape])[0]:
            flavor, units = job.ask.options[0]
            demand[(job.tenant, flavor)] = demand.get((job.tenant, flavor), 0) + units * r["jobs"]
    return demand


async def queued_tenants(conn: asyncpg.Connection) -> list[str]:
    return [r["tenant"] for r in await conn.fetch("SELECT DISTINCT tenant FROM quota_policy_pending ORDER BY 1")]


async def judged_jobs(conn: asyncpg.Connection, tenant: str) -> int:
    """The tenant's jobs quota has decided on: holding a reservation, or waiting with a reason."""
    return await conn.fetchval(
        "SELECT (SELECT count(*) FROM quota_policy_pending WHERE tenant = $1 AND last_reason IS NOT NULL)"
        " + (SELECT count(*) FROM quota_policy_reservations WHERE tenant = $1)", tenant)


async def reserved_tenants(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, str]:
    """The tenant quota reserved each job's GPUs for (a job without a reservation is left out)."""
    rows = await conn.fetch("SELECT job_id, tenant FROM quota_policy_reservations WHERE job_id = ANY($1::text[])",
                            job_ids)
    return {r["job_id"]: r["tenant"] for r in rows}


async def quota_queue(conn: asyncpg.Connection, now: datetime,
                      tenancies: TenancyStore | None = None) -> list[QuotaQueueEntry]:
    """Every job waiting for quota, cohort by cohort (sorted by name), each cohort in queue order. With
    no tenancy in force yet, the jobs are listed without positions."""
    tenancy = await (tenancies or TenancyStore()).read(conn)
    if tenancy is None:
        return [QuotaQueueEntry(job.job_id, job.tenant, "-", None, 0, "no tenancy is in force yet")
                for job in await load_queued(conn, (), ())]
    out: list[QuotaQueueEntry] = []
    for cohort in sorted({cohort_of(tenancy, t) for t in await queued_tenants(conn)}):
        members = cohort_members(tenancy, cohort)
        queued = await load_cohort_queue(conn, tenancy, cohort)
        usage = await read_usage(conn, members)
        out += rank_cohort(tenancy, cohort, usage, await load_history(conn, members), queued, now.timestamp())
    return out


@dataclass(frozen=True)
class WaitingShape:
    """Jobs waiting for quota or placement alike in what a backlog counts (``waiting_shapes``)."""

    tenant: str
    gpus: int
    gpu_model: str | None  # the model the jobs name
    flavor: str | None  # the flavor quota charged them to (None while they wait for quota)
    reserved: bool  # quota reserved their GPUs: they wait for placement
    jobs: int


async def waiting_shapes(conn: asyncpg.Connection) -> list[WaitingShape]:
    """The jobs waiting for quota or placement (the jobs read model) and the flavors their reservations were
    charged to, counted by shape in the store: a reader of the backlog's sums holds none of its jobs."""
    rows = await conn.fetch(
        "SELECT coalesce(j.tenant, '') AS tenant, coalesce(j.gpus, 0) AS gpus, j.gpu_model, r.flavor,"
        " j.status = 'Queued' AS reserved, count(*) AS jobs"
        " FROM jobs j LEFT JOIN quota_policy_reservations r ON r.job_id = j.job_id"
        " WHERE j.status IN ('Admitted', 'Queued') GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5")
    return [WaitingShape(r["tenant"], r["gpus"], r["gpu_model"], r["flavor"], r["reserved"], r["jobs"]) for r in rows]


@dataclass(frozen=True)
class TenantTotals:
    tenant: str
    nominal_units: int  # over every flavor
    reserved_units: int


async def tenant_totals(conn: asyncpg.Connection) -> list[TenantTotals]:
    """Each tenant's nominal and reserved quota units over every flavor, by tenant."""
    rows = await conn.fetch(
        "SELECT tenant, sum(nominal_units) AS nominal, sum(reserved_units) AS reserved FROM quota_policy_usage"
        " GROUP BY tenant ORDER BY tenant")
    return [TenantTotals(r["tenant"], r["nominal"], r["reserved"]) for r in rows]


async def usage_by_flavor(conn: asyncpg.Connection, tenant: str | None) -> list[dict]:
    """Each tenant's reserved, nominal and limit units per flavor, by (tenant, flavor); ``tenant`` narrows
    to one (None: every tenant). For the gateway's tenants view."""
    rows = await conn.fetch(
        "SELECT tenant, flavor, reserved_units, nominal_units, limit_units FROM quota_policy_usage"
        " WHERE ($1::text IS NULL OR tenant = $1) ORDER BY tenant, flavor", tenant)
    return [dict(r) for r in rows]


async def reservations_held(conn: asyncpg.Connection, tenants: list[str]) -> int:
    """How many jobs of these tenants hold a quota reservation now."""
    return await conn.fetchval("SELECT count(*) FROM quota_policy_reservations WHERE tenant = ANY($1::text[])",
                               tenants)


async def recorded_reclaim(conn: asyncpg.Connection, event_id: str) -> ev.ReclaimRequested | None:
    """A reclaim request as quota recorded it when it sent it (None: quota sent no such request): preemption
    answers the recorded request, never what a message claims (borrowers named by a forger)."""
    try:
        uuid.UUID(event_id)
    except ValueError:
        return None
    row = await conn.fetchrow("SELECT tenant, cohort, flavor, units, for_jobs, borrowers, reason, requested_at"
                              " FROM quota_reclaims WHERE event_id = $1::uuid", event_id)
    if row is None:
        return None
    return ev.ReclaimRequested(tenant=row["tenant"], cohort=row["cohort"], flavor=row["flavor"],
                               gpus=row["units"] / UNITS_PER_GPU, for_jobs=list(row["for_jobs"]),
                               borrowers=[ev.ReclaimBorrower.model_validate(b) for b in row["borrowers"]],
                               reason=row["reason"], requested_at=row["requested_at"])
