"""Quota's charges given back (``release_many``: a batch's ended, preempted or held jobs together) and the
usage histories fair share decays, advanced before a tenant's usage changes."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_common.jobs import append_many_job_events, load_jobs
from gpusched_common.stores import quota as reads
from gpusched_core import lifecycle
from gpusched_core.quota import UNITS_PER_GPU, Tenancy, UsageHistory, advance, rate_geq
from gpusched_core.quota.jobs import cohort_members

from services.quota import store

SERVICE = "quota"


async def release(conn: asyncpg.Connection, tenancy: Tenancy, job_id: str, now: datetime) -> str | None:
    """``release_many`` for one job: the tenant charged, or None when it held no quota."""
    released = (await release_many(conn, tenancy, [job_id], now)).get(job_id)
    return released[0] if released is not None else None


async def release_many(conn: asyncpg.Connection, tenancy: Tenancy, job_ids: list[str],
                       now: datetime) -> dict[str, tuple[str, lifecycle.JobState]]:
    """Give finished (or preempted, or held) jobs' units back, out of quota's line too, in a few statements
    for all of them; for each job that held quota, the tenant charged and the job's state afterwards. The
    jobs and their charges are read again with their cohorts' rows locked (all of them in one statement, in
    (tenant, flavor) order): two releases of one job (its end message, and the recovery pass that saw the
    same end in the store) give it back once, and a job the lifecycle does not let go of (it runs, it
    holds) keeps its charge."""
    await store.unqueue_jobs(conn, job_ids)
    states = await load_jobs(conn, job_ids)
    holding = [j for j in job_ids if states[j].quota_held and states[j].spec is not None]
    if not holding:
        return {}
    charged = await store.load_reservations(conn, holding)  # whose rows to lock (read again under the lock)
    tenants = {charged[j]["tenant"] if j in charged else tenancy.charged_tenant(states[j].spec.tenant)  # type: ignore[union-attr]
               for j in holding}
    # a tenant removed from the tenancy since it reserved is a cohort of its own: it shares nothing now
    cohorts = {tenancy.root_of(t) if t in tenancy.tenants else t for t in tenants}
    usage = await store.lock_usage(conn, tenancy, tuple(sorted({m for c in cohorts for m in cohort_members(tenancy, c)})))
    states = await load_jobs(conn, holding)  # as the last holder of the lock left them
    going = [j for j in holding if lifecycle.decide(states[j], lifecycle.ReleaseQuota(0), now)]
    held = await store.load_reservations(conn, going)  # none on record: reserved under the retired flat caps
    await advance_histories(conn, tenancy, {held[j]["tenant"]: usage.get(held[j]["tenant"], {})
                                             for j in going if j in held}, now)
    left = {tenant: dict(per_flavor) for tenant, per_flavor in usage.items()}
    changes, given, tenant_of = [], [], {}
    for j in going:
        gpus_left = 0
        tenant_of[j] = states[j].spec.tenant  # type: ignore[union-attr]
        if j in held:
            tenant_of[j], flavor, units = held[j]["tenant"], held[j]["flavor"], held[j]["units"]
            row = left.setdefault(tenant_of[j], {})
            row[flavor] = gpus_left = row.get(flavor, 0) - units
            given.append((tenant_of[j], flavor, -units))
        changes.append((states[j], lifecycle.decide(states[j], lifecycle.ReleaseQuota(gpus_left // UNITS_PER_GPU), now)))
    await store.charge_many(conn, given, {(t, f): left[t][f] for t, f, _ in given})
    await store.forget_reservations(conn, [j for j in going if j in held])
    after = await append_many_job_events(conn, changes, producer=SERVICE, now=now)
    return {j: (tenant_of[j], state) for j, state in zip(going, after, strict=True)}


async def advance_histories(conn: asyncpg.Connection, tenancy: Tenancy, held: dict[str, dict[str, int]],
                             now: datetime) -> None:
    """Before tenants' usage changes: accrue what each held (``held``) since its history was last advanced,
    in two statements."""
    if not held:
        return
    now_s = now.timestamp()
    past = await reads.load_history(conn, tuple(sorted(held)))
    await store.save_histories(conn, {
        tenant: advance(past.get(tenant, UsageHistory(now_s)), now_s, rate_geq(tenancy, units), tenancy.half_life_s)
        for tenant, units in sorted(held.items())})
