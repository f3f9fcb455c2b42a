"""Preemption service: for jobs that cannot be placed, preempts the fewest lower-priority victims whose
release lets them run, with a checkpoint grace period, and holds the freed GPUs for them; for quota's
reclaim requests, preempts borrowers' jobs to give a tenant under its nominal quota its capacity back."""

from __future__ import annotations


from gpusched_common.runtime import Runtime, run_service, utcnow
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_PREEMPTION, JOBS_EVENTS, QUOTA_RECLAIMS

from gpusched_core import preemption as sel
from services.preemption.handlers import SERVICE, PreemptionSettings, make_handler, make_reclaim_handler


def preemption_settings(settings: Settings) -> PreemptionSettings:
    return PreemptionSettings(
        grace_s=settings.preemption_grace_s,
        config=sel.SelectionConfig(default_min_runtime_s=settings.preemption_min_runtime_s,
                                   cross_tenant=settings.preemption_cross_tenant))


async def setup(runtime: Runtime) -> None:
    settings = preemption_settings(runtime.settings)
    runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_PREEMPTION, make_handler(settings, utcnow))
    # one group per topic: each subscription is its own consumer (the job events keep their old group)
    runtime.subscribe_transactional(QUOTA_RECLAIMS.name, f"{GROUP_PREEMPTION}-reclaims",
                                    make_reclaim_handler(settings, utcnow))


async def main(settings: Settings | None = None) -> None:
    await run_service(SERVICE, settings or Settings(), setup)
