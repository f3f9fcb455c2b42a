"""Preemption service: for jobs that cannot be placed, preempts the fewest lower-priority victims whose
release lets them run, with a checkpoint grace period, and holds the freed GPUs for them; for quota's
reclaim requests, preempts borrowers' jobs to give a tenant under its nominal quota its capacity back."""

from __future__ import annotations

import asyncio
import logging

from gpusched_common.db import DATABASE_AWAY
from gpusched_common.runtime import Runtime, run_service, utcnow
from gpusched_common.stores.tenancy import TenancyStore
from gpusched_common.topics import GROUP_PREEMPTION, GROUP_PREEMPTION_RECLAIMS, JOBS_EVENTS, QUOTA_RECLAIMS

from gpusched_common.stores.cluster import ClusterCache

from services.preemption.handlers import make_handler, make_reclaim_handler, reconsider
from services.preemption.settings import PreemptionSettings
from services.preemption.store import SERVICE
from services.preemption.stuck import StuckPreemptions

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 15.0


async def setup(runtime: Runtime) -> None:
    policy = PreemptionSettings.of(runtime.settings).policy()
    tenancies = TenancyStore()  # read only: which leaf a tenant the tenancy does not name is charged to
    runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_PREEMPTION, make_handler(policy, utcnow, tenancies))
    # one group per topic: each subscription is its own consumer (the job events keep their old group)
    runtime.subscribe_transactional(QUOTA_RECLAIMS.name, GROUP_PREEMPTION_RECLAIMS,
                                    make_reclaim_handler(policy, utcnow, tenancies))
    stuck = StuckPreemptions()

    async def ask_again_loop() -> None:
        """Victims no exit was reported for, well past their grace, are asked again (services/preemption/stuck.py)."""
        assert runtime.pool is not None
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                async with runtime.pool.acquire() as conn, conn.transaction():
                    asked = await stuck.ask_again(conn, utcnow(), policy.grace_s)
            except DATABASE_AWAY as exc:
                log.warning("preemption: stuck preemptions not checked (%s); next time", exc)
                continue
            if asked:
                runtime.wake_relay()

    settings = PreemptionSettings.of(runtime.settings)
    cache = ClusterCache()

    async def reconsider_loop() -> None:
        """The jobs placement deferred, weighed again (``handlers.reconsider``)."""
        assert runtime.pool is not None
        while True:
            await asyncio.sleep(settings.preemption_reconsider_s)
            try:
                async with runtime.pool.acquire() as conn, conn.transaction():
                    await reconsider(conn, policy, utcnow(), tenancies, cache)
            except DATABASE_AWAY as exc:
                log.warning("preemption: deferred jobs not weighed again (%s); next time", exc)

    runtime.background.append(ask_again_loop)
    runtime.background.append(reconsider_loop)


async def main(settings: PreemptionSettings | None = None) -> None:
    await run_service(SERVICE, settings or PreemptionSettings(), setup)
