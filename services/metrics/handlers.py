"""The metrics service's handlers: telemetry in (``TelemetryConsumer`` keeps the latest per GPU), and every
``GPUSCHED_METRICS_LOG_INTERVAL_S`` an evaluation: load the cluster through ``store``, decide views and
scaling with the cores (``gpusched_core.metrics``), store the scaler's state and its decisions with the
outbox in one transaction, record the cycle's samples (utilisation, each GPU's latest reading, each tenant's
usage: ``gpusched_core.dashboard.usage``) in another, export the figures (Prometheus, OTLP) and log what
matters."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import asyncpg

from gpusched_common.db import DATABASE_AWAY
from gpusched_common.runtime import Runtime, utcnow

from gpusched_common import events as ev

from gpusched_core.dashboard import plan_usage_samples
from gpusched_core.metrics.scaling import ScalePolicy, observe, plan_scaling
from gpusched_core.metrics.views import Thresholds, Views, plan_views
from services.metrics.exporter import Latest, MetricsExporter
from services.metrics.http import MetricsEndpoint
from services.metrics.settings import MetricsSettings
from services.metrics.store import (decide_scaling, load_shares, load_snapshot, record_telemetry, record_usage,
                                   record_utilization)
from services.metrics.telemetry_consumer import TelemetryConsumer
from services.metrics.tracker import TelemetryTracker

log = logging.getLogger(__name__)


def thresholds(settings: MetricsSettings) -> Thresholds:
    return Thresholds(max_sample_age=timedelta(seconds=max(3 * settings.telemetry_interval_s, 15.0)),
                      busy_pct=settings.metrics_idle_threshold_pct,
                      idle_after=timedelta(seconds=settings.metrics_idle_after_s))


def scale_policy(settings: MetricsSettings) -> ScalePolicy:
    return ScalePolicy(window_s=settings.scale_out_window_s, clear_s=settings.scale_out_clear_s,
                       cooldown_s=settings.scale_out_cooldown_s, max_nodes=settings.scale_out_max_nodes,
                       scale_in_idle_s=settings.scale_in_idle_s, scale_in_cooldown_s=settings.scale_in_cooldown_s,
                       min_nodes=settings.scale_min_nodes_per_model,
                       provision_timeout_s=settings.scale_provision_timeout_s)


class MetricsService:
    """The evaluation loop's state: telemetry tracker, latest views and the exporter reading them."""

    def __init__(self, settings: MetricsSettings, clock: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings = MetricsSettings.of(settings)
        self.clock = clock
        self.tracker = TelemetryTracker(busy_pct=settings.metrics_idle_threshold_pct)
        self.latest = Latest()
        self.exporter = MetricsExporter(self.tracker, self.latest, _otlp_readers(settings))
        self.endpoint = MetricsEndpoint(self.exporter, self.latest)
        self.port: int | None = None
        self.telemetry: TelemetryConsumer | None = None

    async def evaluate(self, pool: asyncpg.Pool) -> Views:
        now = self.clock()
        async with pool.acquire() as conn:
            snapshot = await load_snapshot(conn, self.settings.metrics_pool_label)
            shares = await load_shares(conn)
        activity, limits = self.tracker.activity(), thresholds(self.settings)
        views = plan_views(snapshot, activity, now, limits)
        self.latest.snapshot, self.latest.views = snapshot, views
        policy = scale_policy(self.settings)
        decisions = await decide_scaling(pool, lambda state: plan_scaling(state, observe(snapshot), now, policy), now)
        for d in decisions:
            key = ("out" if isinstance(d, ev.ScaleOutRequested) else "in", d.gpu_model)
            self.latest.scale_decisions[key] = self.latest.scale_decisions.get(key, 0) + 1
            log.warning("scale %s %s: %s", key[0], d.gpu_model, d.reason)
        for idle in views.idle:
            log.info("idle allocation: job %s (%s) on %s GPUs %s idle for %.0fs", idle.job_id, idle.tenant,
                     idle.node_id, list(idle.gpu_indices), idle.idle_s)
        c = views.cluster
        log.info("cluster: %d GPUs, %d allocated, %d busy, utilization %.1f%%, backlog %s", c.gpus_total,
                 c.gpus_allocated, c.gpus_busy, c.mean_utilization * 100,
                 {b.model: b.pending_gpus for b in views.backlog} or "empty")
        usage = plan_usage_samples(shares, {(g.node_id, g.index): g.model for g in snapshot.gpus}, activity, now,
                                   busy_pct=limits.busy_pct, max_sample_age=limits.max_sample_age)
        async with pool.acquire() as conn:
            async with conn.transaction():  # one cycle's samples land together (the dashboard reads them as one)
                await record_utilization(conn, now, c, keep_s=self.settings.metrics_history_retention_s)
                await record_telemetry(conn, activity.values())
                await record_usage(conn, now, usage, keep_s=self.settings.metrics_usage_retention_s)
            if self.telemetry is not None:
                await self.telemetry.refused.flush(conn, now)  # telemetry no enrolled node signed
        return views

    async def setup(self, runtime: Runtime) -> None:
        telemetry = TelemetryConsumer(self.settings, self.tracker, pool=runtime.pool)
        self.telemetry = telemetry
        runtime.background.append(telemetry.run)
        if self.settings.metrics_port is not None:
            self.port = await self.endpoint.start(self.settings.metrics_host, self.settings.metrics_port)
            log.info("Prometheus endpoint on http://%s:%d/metrics", self.settings.metrics_host, self.port)

        async def evaluate_loop() -> None:
            assert runtime.pool is not None
            while True:
                await asyncio.sleep(self.settings.metrics_log_interval_s)
                try:
                    await self.evaluate(runtime.pool)
                    runtime.wake_relay()
                except DATABASE_AWAY as exc:
                    log.warning("metrics evaluation failed (%s); next interval retries", exc)

        runtime.background.append(evaluate_loop)

    async def close(self) -> None:
        await self.endpoint.stop()
        self.exporter.shutdown()


def _otlp_readers(settings: MetricsSettings) -> list:
    if settings.trace_exporter != "otlp":
        return []
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return [PeriodicExportingMetricReader(OTLPMetricExporter())]
