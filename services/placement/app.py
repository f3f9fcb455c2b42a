"""Placement service: places quota-reserved jobs on whole GPUs and tells node agents to start them."""

from __future__ import annotations

from datetime import datetime, timezone

from gpusched_common.runtime import Runtime, run_service
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_PLACEMENT, JOBS_EVENTS, NODES_REPORTS

from services.placement.handlers import SERVICE, make_handlers


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


async def setup(runtime: Runtime) -> None:
    on_job_event, on_node_report = make_handlers(runtime, utcnow)
    # one group per topic: each subscription is its own consumer
    runtime.subscribe(JOBS_EVENTS.name, f"{GROUP_PLACEMENT}-jobs", on_job_event)
    runtime.subscribe(NODES_REPORTS.name, f"{GROUP_PLACEMENT}-nodes", on_node_report)


async def main(settings: Settings | None = None) -> None:
    await run_service(SERVICE, settings or Settings(), setup)
