"""Fair-share preemption in the live service: for the deferred jobs of a batch that hold quota, the trigger
the selection core weighs them with when no priority preemption helps (``gpusched_core.preemption.fairshare``:
runs of tenants of the job's cohort well over their fair share, older than the quantum, within what each
may lose). Read from the store without the cycle lock, once per cohort a batch touches; no more is read
when no run is old enough to be taken, nor past the usage when nobody in the cohort borrows."""

from __future__ import annotations

from datetime import datetime, timedelta

import asyncpg

from gpusched_common.stores.quota import load_history, read_usage, reservations_of, waiting_demand
from gpusched_common.stores.tenancy import TenancyStore

from gpusched_core import lifecycle
from gpusched_core import preemption as sel
from gpusched_core.preemption.fairshare import fair_selection, fair_share_trigger
from gpusched_core.quota import QuotaSnapshot
from gpusched_core.quota.fairness import held_and_waiting
from gpusched_core.quota.jobs import cohort_members, cohort_of
from services.preemption.settings import PreemptionPolicy


async def fair_triggers(conn: asyncpg.Connection, waiting: list[lifecycle.JobState], policy: PreemptionPolicy,
                        now: datetime, tenancies: TenancyStore,
                        oldest_run: datetime | None) -> dict[str, tuple[sel.FairShareTrigger, int]]:
    """By job id, the trigger and the quota units it holds, for each waiting job that may take runs by fair
    share. ``oldest_run``: when the longest-running job not being preempted (re)started."""
    if policy.fair_margin is None or oldest_run is None or oldest_run > now - timedelta(seconds=policy.fair_quantum_s):
        return {}
    reserved = await reservations_of(conn, [state.job_id for state in waiting])
    if not reserved:
        return {}
    tenancy = await tenancies.read(conn)
    if tenancy is None:
        return {}
    cohorts: dict[str, list[tuple[str, tuple[str, str, int]]]] = {}
    for job_id, reservation in reserved.items():
        cohorts.setdefault(cohort_of(tenancy, reservation[0]), []).append((job_id, reservation))
    triggers = {}
    for cohort, jobs in sorted(cohorts.items()):
        members = cohort_members(tenancy, cohort)
        usage = await read_usage(conn, members)
        if not any(units > tenancy.nominal_units(tenant, flavor) for tenant, row in usage.items()
                   for flavor, units in row.items()):
            continue  # nobody borrows: fair share takes nothing from a tenant within its nominal quota
        snapshot = QuotaSnapshot(tenancy, usage, await load_history(conn, members), now.timestamp())
        demand = held_and_waiting(snapshot, await waiting_demand(conn, tenancy, cohort))
        for job_id, (tenant, flavor, units) in jobs:
            trigger = fair_share_trigger(snapshot, demand, tenant, flavor, units, policy.fair_margin)
            if trigger is not None:
                triggers[job_id] = trigger, units
    return triggers


def fair_config(policy: PreemptionPolicy) -> sel.SelectionConfig:
    """The selection settings fair-share preemption decides with (``fairshare.fair_selection``)."""
    return fair_selection(policy.config, policy.fair_quantum_s)
