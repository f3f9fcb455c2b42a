"""Admission service: validates submissions and admits or rejects them with reasons."""

from __future__ import annotations

from datetime import datetime, timezone

from gpusched_common.runtime import Runtime, run_service
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_ADMISSION, JOBS_SUBMITTED

from services.admission.core import AdmissionLimits
from services.admission.handlers import SERVICE, make_submission_handler


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


async def setup(runtime: Runtime) -> None:
    handler = make_submission_handler(AdmissionLimits(), utcnow)
    runtime.subscribe_transactional(JOBS_SUBMITTED.name, GROUP_ADMISSION, handler)


async def main(settings: Settings | None = None) -> None:
    await run_service(SERVICE, settings or Settings(), setup)
