"""Quota service: reserves and releases quota for jobs. With ``GPUSCHED_TENANTS_FILE`` it enforces the
tenancy tree (cohorts, borrowing, fair share; ``services.quota.policy``); without it, flat per-tenant GPU
caps from the quota file."""

from __future__ import annotations

import asyncio
import logging

from gpusched_common.runtime import Runtime, run_service, utcnow
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_QUOTA, JOBS_EVENTS

from services.quota.config import QuotaConfig, load_quota_config
from services.quota.handlers import SERVICE, make_job_event_handler, reserve_for_tenant
from services.quota.policy import Tenancy, load_tenancy
from services.quota.policy_handlers import make_policy_job_event_handler, reserve_for_cohort
from services.quota.policy_store import apply_limits

log = logging.getLogger(__name__)



async def apply_caps(runtime: Runtime, config: QuotaConfig) -> None:
    """Write the configured caps; a cap below what a tenant already holds waits until usage drains."""
    async with runtime.pool.acquire() as conn:
        for tenant, quota in config.tenants.items():
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO quota_ledger (tenant, cap_gpus) VALUES ($1, $2) ON CONFLICT (tenant) DO UPDATE"
                    " SET cap_gpus = greatest(EXCLUDED.cap_gpus, quota_ledger.reserved_gpus)", tenant,
                    quota.gpu_cap)
                # work that waited under an old, smaller cap may fit now
                await reserve_for_tenant(conn, tenant, quota.gpu_cap, utcnow())
    runtime.wake_relay()


async def apply_tenancy(runtime: Runtime, tenancy: Tenancy) -> None:
    """Write the tenancy's limits, then run one cycle per cohort: waiting work may fit the new quotas."""
    async with runtime.pool.acquire() as conn:
        async with conn.transaction():
            await apply_limits(conn, tenancy)
        for cohort in sorted({tenancy.root_of(t) for t in tenancy.leaves()}):
            async with conn.transaction():
                await reserve_for_cohort(conn, tenancy, cohort, utcnow())
    runtime.wake_relay()


async def reconcile_loop(runtime: Runtime, config: QuotaConfig) -> None:
    """Every few seconds, a reservation pass for each tenant with waiting work, from the store alone, so a
    lost or delayed message never strands a job."""
    while True:
        await asyncio.sleep(runtime.settings.reconcile_interval_s)
        try:
            async with runtime.pool.acquire() as conn:
                tenants = [r["tenant"] for r in await conn.fetch("SELECT DISTINCT tenant FROM quota_pending ORDER BY 1")]
                for tenant in tenants:
                    async with conn.transaction():
                        await reserve_for_tenant(conn, tenant, config.cap_for(tenant), utcnow())
        except Exception:  # noqa: BLE001 - a database outage must not end the reconciliation
            log.exception("quota reconciliation failed; retrying")
            continue
        if tenants:
            runtime.wake_relay()


async def main(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    if settings.tenants_file is not None:
        tenancy = load_tenancy(settings.tenants_file.read_text())

        async def setup(runtime: Runtime) -> None:
            await apply_tenancy(runtime, tenancy)
            runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_QUOTA,
                                            make_policy_job_event_handler(tenancy, utcnow))
            log.info("quota policy: tenancy revision %d from %s, %d tenants", tenancy.revision,
                     settings.tenants_file, len(tenancy.leaves()))
    else:
        config = load_quota_config(settings.quota_file, settings.default_tenant_gpu_cap)

        async def setup(runtime: Runtime) -> None:
            await apply_caps(runtime, config)
            runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_QUOTA, make_job_event_handler(config, utcnow))
            runtime.background.append(lambda: reconcile_loop(runtime, config))
            log.info("quota caps: default %d GPUs, %s", config.default_gpu_cap,
                     {t: q.gpu_cap for t, q in config.tenants.items()})

    await run_service(SERVICE, settings, setup)
