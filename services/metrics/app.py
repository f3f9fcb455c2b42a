"""Metrics service: cluster GPU utilization from telemetry, logged, stored and exported as an
OpenTelemetry metric (`gpusched_gpu_utilization_ratio`)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

from gpusched_common import events as ev
from gpusched_common.messaging import Incoming, PoisonMessage
from gpusched_common.runtime import Runtime, run_service
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_METRICS, NODES_TELEMETRY

from services.metrics.core import ClusterUtilization, GpuReading, summarize

SERVICE = "metrics"
log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UtilizationTracker:
    def __init__(self, max_age: timedelta) -> None:
        self._latest: dict[tuple[str, int], GpuReading] = {}
        self._max_age = max_age

    def on_telemetry(self, message: Incoming) -> None:
        try:
            envelope = ev.Envelope.model_validate_json(message.value)
            payload = ev.parse_payload(envelope)
        except ValueError as exc:
            raise PoisonMessage(f"unreadable telemetry: {exc}") from exc
        if not isinstance(payload, ev.GpuTelemetry):
            return
        for sample in payload.samples:
            self._latest[(payload.node_id, sample.index)] = GpuReading(
                payload.node_id, sample.index, sample.utilization_pct, payload.sampled_at)

    def current(self, now: datetime) -> ClusterUtilization:
        return summarize(list(self._latest.values()), now, self._max_age)

    def observe(self, options: CallbackOptions) -> list[Observation]:
        now = utcnow()
        fresh = [r for r in self._latest.values() if now - r.sampled_at <= self._max_age]
        return [Observation(r.utilization_pct / 100.0, {"node": r.node_id, "gpu": str(r.index)}) for r in fresh]


def configure_metrics(settings: Settings, tracker: UtilizationTracker) -> MeterProvider:
    readers = []
    if settings.trace_exporter == "console":
        readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000))
    elif settings.trace_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    provider = MeterProvider(metric_readers=readers)
    metrics.set_meter_provider(provider)
    meter = provider.get_meter("gpusched.metrics")
    meter.create_observable_gauge("gpusched_gpu_utilization_ratio", callbacks=[tracker.observe],
                                  description="GPU utilization (0..1) from the latest NVML sample", unit="1")
    return provider


async def main(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    tracker = UtilizationTracker(max_age=timedelta(seconds=max(3 * settings.telemetry_interval_s, 15.0)))

    async def setup(runtime: Runtime) -> None:
        configure_metrics(settings, tracker)

        async def handle(message: Incoming) -> None:
            tracker.on_telemetry(message)

        runtime.subscribe(NODES_TELEMETRY.name, GROUP_METRICS, handle)

        async def record_loop() -> None:
            while True:
                await asyncio.sleep(settings.metrics_log_interval_s)
                now = utcnow()
                util = tracker.current(now)
                log.info("cluster GPU utilization %.1f%% (%d/%d GPUs busy)", util.mean_utilization * 100,
                         util.gpus_busy, util.gpus_reporting)
                async with runtime.pool.acquire() as conn:
                    await conn.execute(
                        "INSERT INTO cluster_utilization (sampled_at, gpus_reporting, gpus_busy, mean_utilization)"
                        " VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                        now, util.gpus_reporting, util.gpus_busy, util.mean_utilization)

        runtime.background.append(record_loop)

    await run_service(SERVICE, settings, setup)
