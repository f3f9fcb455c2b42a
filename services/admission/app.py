"""Admission service: validates submissions and admits or rejects them with reasons."""

from __future__ import annotations

import logging

from gpusched_common.credentials import load_keys
from gpusched_common.gpu_catalogue import read_catalogue
from gpusched_common.runtime import Runtime, run_service, utcnow
from gpusched_common.stores.gpu_models import ModelReader
from gpusched_common.topics import GROUP_ADMISSION, GROUP_ADMISSION_CONTROL, JOBS_CONTROL, JOBS_SUBMITTED

from services.admission.core import AdmissionLimits, RateLimit
from services.admission.handlers import SERVICE, AdmissionPolicy, make_control_handler, make_submission_handler
from services.admission.settings import AdmissionSettings

log = logging.getLogger(__name__)


def build_policy(settings: AdmissionSettings) -> AdmissionPolicy:
    keys = None
    if settings.tenant_keys_file is not None:
        keys = load_keys(settings.tenant_keys_file)
        log.info("tenant keys: %d key(s) from %s", len(keys), settings.tenant_keys_file)
    required = keys is not None or settings.admission_require_credentials
    if not required:
        log.warning("GPUSCHED_ADMISSION_REQUIRE_CREDENTIALS=false and no GPUSCHED_TENANT_KEYS_FILE: submissions "
                    "without a credential are admitted (development only)")
    return AdmissionPolicy(AdmissionLimits(), RateLimit(settings.admission_rate_per_s, settings.admission_rate_burst),
                           keys, required)


async def setup(runtime: Runtime) -> None:
    settings = AdmissionSettings.of(runtime.settings)
    models = ModelReader(read_catalogue(settings.gpu_catalogue))  # a bad catalogue stops the start, with its problems
    handler = make_submission_handler(build_policy(settings), utcnow, models=models)
    # submissions are judged by admission itself: one that does not validate is rejected with its reasons
    runtime.subscribe_transactional(JOBS_SUBMITTED.name, GROUP_ADMISSION, handler, screen=None)
    runtime.subscribe_transactional(JOBS_CONTROL.name, GROUP_ADMISSION_CONTROL, make_control_handler(utcnow))


async def main(settings: AdmissionSettings | None = None) -> None:
    await run_service(SERVICE, settings or AdmissionSettings(), setup)
