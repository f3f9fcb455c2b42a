"""Cluster, pool, model and tenant views; the idle-allocation report; backlog; fragmentation; the exporter."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from gpusched_common import events as ev

from gpusched_core.metrics.views import GpuReading, Thresholds, fragmentation, plan_views
from services.metrics.exporter import Latest, MetricsExporter
from services.metrics.http import MetricsEndpoint
from services.metrics.tracker import TelemetryTracker
from tests.unit.metrics.builders import at, cluster

TH = Thresholds(max_sample_age=timedelta(seconds=15), busy_pct=5.0, idle_after=timedelta(seconds=300))


def reading(node: str, index: int, util: float, t: float, last_busy: float | None = None) -> GpuReading:
    return GpuReading(node, index, util, at(t), last_busy_at=at(last_busy) if last_busy is not None else None)


def test_views_count_allocated_versus_used_gpus_per_cluster_pool_and_model():
    snapshot = (cluster().nodes("H100-80GB", 1, gpus=4, pool="train").nodes("L4-24GB", 1, gpus=2, pool="serve")
                .allocated("n-h100-1", 0, "j1").allocated("n-h100-1", 1, "j2").allocated("n-l4-1", 0, "j3").build())
    activity = {("n-h100-1", 0): reading("n-h100-1", 0, 90, 1000), ("n-h100-1", 1): reading("n-h100-1", 1, 0, 1000),
                ("n-l4-1", 0): reading("n-l4-1", 0, 50, 500)}  # stale: older than 15 s
    views = plan_views(snapshot, activity, at(1005), TH)
    c = views.cluster
    assert (c.gpus_total, c.gpus_allocated, c.gpus_reporting, c.gpus_busy) == (6, 3, 2, 1)
    assert c.mean_utilization == 0.45
    assert {p.key: (p.gpus_total, p.gpus_allocated) for p in views.pools} == {"serve": (2, 1), "train": (4, 2)}
    assert {m.key: m.gpus_busy for m in views.models} == {"H100-80GB": 1, "L4-24GB": 0}


def test_the_idle_report_names_jobs_whose_gpus_all_sat_idle_past_the_threshold():
    snapshot = (cluster().nodes("H100-80GB", 1, gpus=4)
                .allocated("n-h100-1", 0, "idle-job", tenant="research", since=0)
                .allocated("n-h100-1", 1, "idle-job", tenant="research", since=0)
                .allocated("n-h100-1", 2, "half-busy", since=0).allocated("n-h100-1", 3, "half-busy", since=0)
                .build())
    activity = {("n-h100-1", 0): reading("n-h100-1", 0, 0, 1000, last_busy=100),
                ("n-h100-1", 1): reading("n-h100-1", 1, 1, 1000, last_busy=200),
                ("n-h100-1", 2): reading("n-h100-1", 2, 0, 1000, last_busy=0),
                ("n-h100-1", 3): reading("n-h100-1", 3, 70, 1000, last_busy=1000)}
    views = plan_views(snapshot, activity, at(1000), TH)
    assert [(a.job_id, a.tenant, a.gpu_indices, a.idle_s) for a in views.idle] == [
        ("idle-job", "research", (0, 1), 800.0)]
    assert views.cluster.gpus_allocated_idle == 2


def test_backlog_and_tenant_usage_against_quota():
    snapshot = (cluster().nodes("H100-80GB", 1, gpus=2).allocated("n-h100-1", 0, "j1", tenant="research")
                .pending("p1", 4, "H100-80GB").pending("p2", 2, None).pending("p3", 8, "H100-80GB", reserved=False)
                .quota("research", 8, 5).quota("idle-team", 4, 0).build())
    views = plan_views(snapshot, {("n-h100-1", 0): reading("n-h100-1", 0, 80, 10)}, at(10), TH)
    assert [(b.model, b.pending_jobs, b.pending_gpus, b.waiting_for_quota_gpus) for b in views.backlog] == [
        ("H100-80GB", 2, 4, 8), ("any", 1, 2, 0)]
    assert [(t.tenant, t.allocated_gpus, t.busy_gpus, t.reserved_gpus, t.cap_gpus) for t in views.tenants] == [
        ("idle-team", 0, 0, 0, 4), ("research", 1, 1, 5, 8)]


def test_fragmentation_is_free_capacity_that_pending_requests_cannot_use():
    b = cluster().nodes("H100-80GB", 2, gpus=8)
    for i in range(6):
        b.allocated("n-h100-1", i, f"a{i}")
        b.allocated("n-h100-2", i, f"b{i}")
    snapshot = b.pending("big", 4, "H100-80GB").build()
    assert fragmentation(snapshot.gpus, snapshot.pending) == {"H100-80GB": 1.0}  # 2 + 2 free, no node has 4
    assert fragmentation(snapshot.gpus, []) == {"H100-80GB": 0.0}


async def test_telemetry_reaches_the_prometheus_endpoint_with_documented_names():
    tracker = TelemetryTracker()
    sample = ev.GpuSample(index=0, uuid="GPU-0", utilization_pct=75.0, memory_used_mib=1024, memory_total_mib=81559,
                          power_w=400.0, temperature_c=60.0, sm_clock_mhz=1980,
                          processes=[ev.GpuProcessSample(pid=9, memory_used_mib=1024, job_id="j1")])
    envelope = ev.make_envelope(ev.GpuTelemetry(node_id="n-h100-1", sampled_at=at(0), samples=[sample]),
                                event_id="e1", stream_id="node-n-h100-1", occurred_at=at(0), producer="t")
    assert tracker.ingest(envelope.model_dump_json().encode()) == 1
    snapshot = cluster().nodes("H100-80GB", 1, gpus=1).allocated("n-h100-1", 0, "j1").pending("p", 2, "H100-80GB").build()
    latest = Latest(views=plan_views(snapshot, tracker.activity(), at(1), TH), snapshot=snapshot)
    exporter = MetricsExporter(tracker, latest)
    endpoint = MetricsEndpoint(exporter, latest)
    port = await endpoint.start("127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        text = (await reader.read()).decode()
        writer.close()
    finally:
        await endpoint.stop()
        exporter.shutdown()
    assert text.startswith("HTTP/1.1 200 OK")
    assert 'gpusched_gpu_utilization_ratio{gpu="0",model="H100-80GB",node="n-h100-1",pool="default"} 0.75' in text
    assert 'gpusched_queue_pending_gpus{model="H100-80GB"} 2.0' in text
    assert 'gpusched_job_gpu_memory_used_bytes{job="j1",node="n-h100-1"}' in text
    assert 'gpusched_tenant_usage_gpus{tenant="t1"} 1.0' in text
    assert "gpusched_fragmentation_ratio" in text and "gpusched_telemetry_samples_total 1.0" in text
