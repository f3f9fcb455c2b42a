"""Quota service: per-tenant GPU caps from the quota file; reserves and releases quota for jobs."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from gpusched_common.runtime import Runtime, run_service
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_QUOTA, JOBS_EVENTS

from services.quota.config import QuotaConfig, load_quota_config
from services.quota.handlers import SERVICE, make_job_event_handler, reserve_for_tenant

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


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


async def main(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    config = load_quota_config(settings.quota_file, settings.default_tenant_gpu_cap)

    async def setup(runtime: Runtime) -> None:
        await apply_caps(runtime, config)
        runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_QUOTA, make_job_event_handler(config, utcnow))
        log.info("quota caps: default %d GPUs, %s", config.default_gpu_cap,
                 {t: q.gpu_cap for t, q in config.tenants.items()})

    await run_service(SERVICE, settings, setup)
