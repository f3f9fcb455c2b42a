"""OpenTelemetry metrics of the cluster, exported for Prometheus (scrape `/metrics`) and, when configured,
over OTLP. Instruments are observable: each scrape reads the latest views and telemetry.

Metric names and labels (every GPU metric: node, gpu, model, pool):
  gpusched_gpu_utilization_ratio, gpusched_gpu_memory_used_bytes, gpusched_gpu_power_watts,
  gpusched_gpu_temperature_celsius, gpusched_gpu_sm_clock_hertz, gpusched_gpu_healthy (1/0)
  gpusched_gpus_total / _allocated / _busy / _allocated_idle / _healthy {scope=cluster|pool|model, name}
  gpusched_cluster_utilization_ratio, gpusched_gpu_allocation_ratio{scope, name}
  gpusched_queue_pending_gpus{model}, gpusched_queue_pending_jobs{model}, gpusched_queue_waiting_for_quota_gpus{model}
  gpusched_fragmentation_ratio{model}
  gpusched_tenant_usage_gpus{tenant}, gpusched_tenant_busy_gpus{tenant}, gpusched_tenant_quota_gpus{tenant},
  gpusched_tenant_reserved_gpus{tenant}
  gpusched_job_idle_seconds{job, tenant, node} (allocations idle past the threshold)
  gpusched_job_gpu_memory_used_bytes{job, node}
  gpusched_telemetry_samples_total, gpusched_scale_decisions_total{direction, model}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import Counter, MeterProvider, ObservableCounter, ObservableGauge
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest

from gpusched_core.metrics.views import ClusterSnapshot, GroupView, Views
from services.metrics.tracker import TelemetryTracker

MIB = 1024 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Latest:
    """What the evaluation loop last computed; read by every scrape."""

    views: Views | None = None
    snapshot: ClusterSnapshot = field(default_factory=ClusterSnapshot)
    scale_decisions: dict[tuple[str, str], int] = field(default_factory=dict)


class MetricsExporter:
    def __init__(self, tracker: TelemetryTracker, latest: Latest, extra_readers: Iterable[MetricReader] = ()) -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        self._tracker = tracker
        self._latest = latest
        self.registry = CollectorRegistry(auto_describe=False)
        prometheus = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=self.registry,
                                            cardinality_limits={ObservableGauge: 1_000_000, Counter: 10_000,
                                                                ObservableCounter: 10_000})
        self.provider = MeterProvider(metric_readers=[prometheus, *extra_readers],
                                      resource=Resource.create({"service.name": "metrics"}))
        meter = self.provider.get_meter("gpusched.metrics")

        def gauge(name: str, description: str, callback: Callable[[], Iterable[Observation]]) -> None:
            meter.create_observable_gauge(name, callbacks=[lambda _options: list(callback())],
                                          description=description)

        gauge("gpusched_gpu_utilization_ratio", "GPU utilization (0..1), latest NVML sample", self._gpu("util"))
        gauge("gpusched_gpu_memory_used_bytes", "GPU memory in use", self._gpu("memory"))
        gauge("gpusched_gpu_power_watts", "GPU power draw", self._gpu("power"))
        gauge("gpusched_gpu_temperature_celsius", "GPU temperature", self._gpu("temperature"))
        gauge("gpusched_gpu_sm_clock_hertz", "GPU SM clock", self._gpu("clock"))
        gauge("gpusched_gpu_healthy", "1 when the GPU reports healthy, else 0", self._gpu("healthy"))
        for attr, text in (("gpus_total", "GPUs in inventory"), ("gpus_allocated", "GPUs allocated to jobs"),
                           ("gpus_busy", "GPUs above the busy threshold"), ("gpus_healthy", "healthy GPUs"),
                           ("gpus_allocated_idle", "allocated GPUs idle past the threshold")):
            gauge(f"gpusched_{attr}", text, self._groups(attr))
        gauge("gpusched_gpu_allocation_ratio", "allocated / total GPUs", self._groups("allocation_ratio"))
        gauge("gpusched_cluster_utilization_ratio", "mean GPU utilization over reporting GPUs", self._cluster_util)
        gauge("gpusched_queue_pending_gpus", "GPUs requested by jobs waiting for placement", self._backlog("gpus"))
        gauge("gpusched_queue_pending_jobs", "jobs waiting for quota or placement", self._backlog("jobs"))
        gauge("gpusched_queue_waiting_for_quota_gpus", "GPUs requested by jobs waiting for quota",
              self._backlog("quota"))
        gauge("gpusched_fragmentation_ratio", "free GPUs pending requests could not use / free GPUs",
              self._fragmentation)
        gauge("gpusched_tenant_usage_gpus", "GPUs allocated to the tenant's jobs", self._tenants("allocated"))
        gauge("gpusched_tenant_busy_gpus", "allocated GPUs of the tenant that are busy", self._tenants("busy"))
        gauge("gpusched_tenant_quota_gpus", "the tenant's nominal GPU quota", self._tenants("cap"))
        gauge("gpusched_tenant_reserved_gpus", "GPUs of quota the tenant's jobs hold", self._tenants("reserved"))
        gauge("gpusched_job_idle_seconds", "how long an allocated job's GPUs have been idle", self._idle)
        gauge("gpusched_job_gpu_memory_used_bytes", "GPU memory used by a job's processes", self._job_memory)
        meter.create_observable_counter("gpusched_telemetry_samples_total", callbacks=[self._samples],
                                        description="GPU samples received")
        meter.create_observable_counter("gpusched_scale_decisions_total", callbacks=[self._decisions],
                                        description="scale decisions made")

    def render(self) -> bytes:
        """The Prometheus text exposition. Safe to call from a worker thread: callbacks copy what they read
        (the event loop keeps replacing entries; a copy under the GIL sees a consistent dict)."""
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self.provider.shutdown()

    # --- observation callbacks ----------------------------------------------------------------------

    def _gpu(self, what: str) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            slots = {(g.node_id, g.index): g for g in self._latest.snapshot.gpus}
            for (node, index), (sample, _) in list(self._tracker.latest.items()):
                slot = slots.get((node, index))
                labels = {"node": node, "gpu": str(index), "model": slot.model if slot else "unknown",
                          "pool": slot.pool if slot else "unknown"}
                value = {"util": sample.utilization_pct / 100.0, "memory": sample.memory_used_mib * MIB,
                         "power": sample.power_w, "temperature": sample.temperature_c,
                         "clock": sample.sm_clock_mhz * 1_000_000, "healthy": 1.0 if sample.healthy else 0.0}[what]
                yield Observation(value, labels)
        return observe

    def _all_groups(self) -> Iterable[tuple[str, GroupView]]:
        views = self._latest.views
        if views is None:
            return []
        return [("cluster", views.cluster), *(("pool", g) for g in views.pools), *(("model", g) for g in views.models)]

    def _groups(self, attr: str) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            for scope, group in self._all_groups():
                yield Observation(getattr(group, attr), {"scope": scope, "name": group.key})
        return observe

    def _cluster_util(self) -> Iterable[Observation]:
        views = self._latest.views
        return [Observation(views.cluster.mean_utilization)] if views else []

    def _backlog(self, what: str) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            for b in self._latest.views.backlog if self._latest.views else ():
                value = {"gpus": b.pending_gpus, "jobs": b.pending_jobs, "quota": b.waiting_for_quota_gpus}[what]
                yield Observation(value, {"model": b.model})
        return observe

    def _fragmentation(self) -> Iterable[Observation]:
        views = self._latest.views
        return [Observation(v, {"model": m}) for m, v in views.fragmentation.items()] if views else []

    def _tenants(self, what: str) -> Callable[[], Iterable[Observation]]:
        def observe() -> Iterable[Observation]:
            for t in self._latest.views.tenants if self._latest.views else ():
                value = {"allocated": t.allocated_gpus, "busy": t.busy_gpus, "cap": t.cap_gpus,
                         "reserved": t.reserved_gpus}[what]
                if value is not None:
                    yield Observation(value, {"tenant": t.tenant})
        return observe

    def _idle(self) -> Iterable[Observation]:
        views = self._latest.views
        return [Observation(a.idle_s, {"job": a.job_id, "tenant": a.tenant or "", "node": a.node_id})
                for a in views.idle] if views else []

    def _job_memory(self) -> Iterable[Observation]:
        return [Observation(mib * MIB, {"job": job, "node": node})
                for (job, node), mib in sorted(self._tracker.job_memory_mib().items())]

    def _samples(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(self._tracker.samples)]

    def _decisions(self, _options: CallbackOptions) -> list[Observation]:
        return [Observation(n, {"direction": d, "model": m}) for (d, m), n in sorted(self._latest.scale_decisions.items())]
