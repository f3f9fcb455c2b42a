"""Quota service: reserves and releases quota for jobs under the tenancy tree (cohorts, borrowing, fair
share; ``gpusched_core.quota``), asks the preemption service to reclaim borrowed quota, and takes tenancy
revisions from operators at run time.

The tenancy in force is the newest revision in PostgreSQL. At start the file named by
``GPUSCHED_TENANTS_FILE`` is put in force when it is newer than that (or when there is none); an operator's
later revision (``gpusched tenants apply``) survives restarts with an older file.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from gpusched_common.credentials import load_keys
from gpusched_common.db import yielding_to_live_work
from gpusched_common.runtime import Runtime, run_service, utcnow
from gpusched_common.stores.tenancy import TenancyStore
from gpusched_common.topics import GROUP_QUOTA, GROUP_QUOTA_ADMIN, JOBS_EVENTS, TENANCY_UPDATES

from gpusched_core.quota import load_tenancy
from services.quota.handlers import (
    SERVICE,
    CycleOptions,
    make_job_event_handler,
    make_tenancy_update_handler,
    reconcile,
    reserve_everywhere,
    reserve_for_cohort,
)
from services.quota import recovery
from gpusched_common.pacing import CyclePacer, run_due
from services.quota.settings import QuotaSettings
from services.quota.store import install, lock_revisions

log = logging.getLogger(__name__)


async def start_tenancy(pool: asyncpg.Pool, tenants_file: Path | None, tenancies: TenancyStore,
                        options: CycleOptions) -> None:
    """Put the file in force when it is newer than the revision in force; then a cycle per cohort (waiting
    work may fit the quotas now in force). Raises when neither the file nor the database has a tenancy,
    and on a file that is not valid (``TenancyError`` lists every problem)."""
    document = tenants_file.read_text() if tenants_file is not None else None
    tenancy = load_tenancy(document) if document is not None else None
    now = utcnow()
    async with pool.acquire() as conn, conn.transaction():
        in_force = await lock_revisions(conn)
        if tenancy is not None and (in_force is None or tenancy.revision > in_force):
            await install(conn, tenancy, document or "", source=f"file {tenants_file}", event_id=None, now=now)
            log.info("quota: tenancy revision %d from %s in force", tenancy.revision, tenants_file)
        elif tenancy is not None and tenancy.revision < in_force:
            log.info("quota: revision %d in force is newer than %s (revision %d); keeping it", in_force,
                     tenants_file, tenancy.revision)
    async with pool.acquire() as conn, conn.transaction():
        current = await tenancies.current(conn)  # NoTenancy when there is none at all
        await reserve_everywhere(conn, current, now, options)
    log.info("quota: tenancy revision %d, %d tenants", current.revision, len(current.leaves()))


async def reconcile_loop(runtime: Runtime, tenancies: TenancyStore, options: CycleOptions,
                         interval_s: float) -> None:
    """Every few seconds, what lost messages left undone (``recovery``), then a cycle for each cohort with
    waiting work, from the store alone."""
    assert runtime.pool is not None
    while True:
        await asyncio.sleep(interval_s)
        try:
            recovered: dict[str, list[str]] = {}
            try:
                async with runtime.pool.acquire() as conn, conn.transaction(), yielding_to_live_work(conn):
                    recovered = await recovery.recover(conn, tenancies, utcnow())
            except asyncpg.LockNotAvailableError:
                log.info("quota recovery yielded to a batch holding the same jobs; it runs again at the next pass")
            cycles = await reconcile(runtime.pool, tenancies, utcnow(), options)
            if any(recovered.values()):
                runtime.wake_relay()
        except Exception:  # noqa: BLE001 - a database outage must not end the reconciliation
            log.exception("quota reconciliation failed; retrying")
            continue
        if cycles:
            runtime.wake_relay()


async def due_cycles(runtime: Runtime, tenancies: TenancyStore, options: CycleOptions, pacer: CyclePacer) -> None:
    """The cycles batches left due (``pacing``), each in a transaction of its own, from the store alone."""
    assert runtime.pool is not None
    pool = runtime.pool

    async def cycle(cohort: str) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await reserve_for_cohort(conn, await tenancies.current(conn), cohort, utcnow(), options)
        runtime.wake_relay()

    def failed(cohort: str, exc: BaseException) -> None:
        log.warning("quota: the due cycle of cohort %s failed (%s); it is due again shortly", cohort, exc)

    await run_due(pacer, cycle, failed)


def quota_setup(settings: QuotaSettings) -> Callable[[Runtime], Awaitable[None]]:
    """Everything the quota service runs, built from settings (the runtime starts it)."""
    settings = QuotaSettings.of(settings)
    options = CycleOptions(reclaim_cooldown_s=settings.quota_reclaim_cooldown_s,
                           fair_margin=settings.backfill_margin)
    keys = load_keys(settings.tenant_keys_file) if settings.tenant_keys_file else None
    tenancies = TenancyStore()

    async def setup(runtime: Runtime) -> None:
        assert runtime.pool is not None
        await start_tenancy(runtime.pool, settings.tenants_file, tenancies, options)
        runtime.wake_relay()
        pacer = CyclePacer(settings.quota_cycle_share)
        runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_QUOTA,
                                        make_job_event_handler(tenancies, utcnow, options, pacer))
        runtime.background.append(lambda: due_cycles(runtime, tenancies, options, pacer))
        runtime.subscribe_transactional(TENANCY_UPDATES.name, GROUP_QUOTA_ADMIN,
                                        make_tenancy_update_handler(keys, utcnow, options))
        runtime.background.append(lambda: reconcile_loop(runtime, tenancies, options, settings.reconcile_interval_s))
        if keys is None:
            log.warning("quota: no GPUSCHED_TENANT_KEYS_FILE: every tenancy update will be refused")

    return setup


async def main(settings: QuotaSettings | None = None) -> None:
    settings = settings or QuotaSettings()
    await run_service(SERVICE, settings, quota_setup(settings))
