"""Metrics service: node telemetry in, utilisation views (Prometheus ``/metrics``, OTLP) and scale
decisions out (``ScaleOutRequested`` / ``ScaleInRequested`` on ``gpusched.cluster.scaling``)."""

from __future__ import annotations

from gpusched_common.runtime import run_service

from services.metrics.handlers import MetricsService
from services.metrics.settings import MetricsSettings
from services.metrics.store import SERVICE


async def main(settings: MetricsSettings | None = None) -> None:
    settings = settings or MetricsSettings()
    service = MetricsService(settings)
    try:
        await run_service(SERVICE, settings, service.setup)
    finally:
        await service.close()
