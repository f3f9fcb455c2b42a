"""The metrics service on the real broker and PostgreSQL: a job's telemetry from a simulated agent reaches
the Prometheus endpoint, and a backlog the cluster cannot place yields exactly one scale-out decision,
published through the outbox with its evidence."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

from aiokafka import AIOKafkaProducer

from gpusched_common import events as ev
from gpusched_common.db import connect, create_pool
from gpusched_common.runtime import running
from gpusched_common.signing import SENDER_HEADER
from gpusched_common.topics import CLUSTER_SCALING, NODES_TELEMETRY

from services.metrics.handlers import MetricsService
from services.metrics.settings import MetricsSettings
from services.metrics.telemetry_consumer import TelemetryConsumer
from services.metrics.tracker import TelemetryTracker
from services.node_agent.app import agent_setup
from tests.integration.kafka_helpers import read_topic
from tests.integration.test_agent_broker import send_command, start_job


async def seed(database_url: str) -> None:
    """What placement and quota would have recorded: one node with 2 H100s, job `mj` on GPU 0, a backlog."""
    now = datetime.now(timezone.utc)
    pool = await create_pool(database_url)
    try:
        await pool.execute("INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend,"
                           " registered_at, last_seen_at) VALUES ('node-m', 'sim', $1, 32000, 262144, 'simulated',"
                           " $2, $2)", {"gpusched.io/pool": "train"}, now)
        await pool.executemany("INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib)"
                               " VALUES ('node-m', $1, $2, 'H100-80GB', 81559)", [(0, "GPU-0"), (1, "GPU-1")])
        await pool.execute("INSERT INTO gpu_allocations VALUES ('node-m', 0, 'mj', $1)", now)
        rows = [("mj", "research", "Running", 1, "H100-80GB"), ("wait-0", "research", "Queued", 2, None)] + [
            (f"wait-{i}", "research", "Queued", 2, "H100-80GB") for i in (1, 2)]
        await pool.executemany("INSERT INTO jobs (job_id, tenant, status, version, gpus, gpu_model, updated_at)"
                               " VALUES ($1, $2, $3, 3, $4, $5, now())", rows)
        # quota's rows: research holds 7 of its nominal 16 H100s; wait-0 names no model but was charged an H100
        await pool.execute("INSERT INTO quota_policy_usage (tenant, flavor, reserved_units, limit_units, nominal_units)"
                           " VALUES ('research', 'H100-80GB', 49000, NULL, 112000)")
        await pool.execute("INSERT INTO quota_policy_reservations VALUES ('wait-0', 'research', 'H100-80GB', 14000)")
    finally:
        await pool.close()


async def scrape(port: int, path: str = "/metrics") -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    text = (await reader.read()).decode()
    writer.close()
    return text.split("\r\n\r\n", 1)[1]


async def test_job_telemetry_reaches_prometheus_and_a_backlog_scales_out_once(settings, make_agent_settings):
    await seed(settings.database_url)
    agent_settings = make_agent_settings(node_id="node-m", telemetry_interval_s=0.2,
                                         heartbeat_interval_s=5.0)
    metrics_settings = MetricsSettings.of(settings, metrics_port=0, metrics_log_interval_s=0.3,
                                          scale_out_window_s=0.0, scale_out_cooldown_s=600.0,
                                          accept_unsigned_node_reports=True)  # an unenrolled agent (development)
    service = MetricsService(metrics_settings)
    setup, _ = agent_setup(agent_settings)
    async with running("node-agent-m", agent_settings, setup, uses_database=False), \
            running("metrics", metrics_settings, service.setup):
        await send_command(settings, start_job("mj", "node-m", "sleep", "20", gpus=(0,)), "node-m")
        assert service.port is not None
        deadline = asyncio.get_running_loop().time() + 30
        text = ""
        while asyncio.get_running_loop().time() < deadline:
            text = await scrape(service.port)
            if 'gpusched_job_gpu_memory_used_bytes{job="mj",node="node-m"}' in text and "gpusched_queue_pending_gpus" in text:
                break
            await asyncio.sleep(0.3)
        idle = json.loads(await scrape(service.port, "/idle"))
        views = json.loads(await scrape(service.port, "/views"))
        decisions = await read_topic(settings.kafka_bootstrap, CLUSTER_SCALING.name, expect=1, timeout_s=15)
        await asyncio.sleep(1.0)  # a few more evaluations: still one decision
        stored = await _scale_rows(settings.database_url)
        _stop_job(agent_settings.agent_work_dir / "node-m", "mj")  # leave nothing running behind the test
    assert 'gpusched_job_gpu_memory_used_bytes{job="mj",node="node-m"}' in text, text
    line = next(li for li in text.splitlines()
                if li.startswith('gpusched_gpu_utilization_ratio{gpu="0",model="H100-80GB",node="node-m",pool="train"}'))
    assert float(line.rsplit(" ", 1)[1]) > 0.5
    assert 'gpusched_queue_pending_gpus{model="H100-80GB"} 6.0' in text
    assert 'gpusched_tenant_usage_gpus{tenant="research"} 1.0' in text
    assert 'gpusched_tenant_quota_gpus{tenant="research"} 16.0' in text
    assert 'gpusched_tenant_reserved_gpus{tenant="research"} 7.0' in text
    assert idle == [] and views["cluster"][0]["gpus_allocated"] == 1
    assert len(decisions) == 1
    decision = json.loads(decisions[0].value)
    assert decision["type"] == "ScaleOutRequested" and decisions[0].key == b"H100-80GB"
    payload = decision["payload"]
    assert (payload["nodes"], payload["unplaceable_gpus"], payload["free_gpus"], payload["gpus_per_node"]) == (3, 6, 1, 2)
    assert stored == [("out", "H100-80GB", 3)]


def _stop_job(work_dir, job_id: str) -> None:
    import os
    import signal

    from services.node_agent.runner import JobRunner

    record = JobRunner(work_dir).record(job_id)
    if record is not None:
        try:
            os.killpg(record.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


async def _scale_rows(database_url: str) -> list[tuple]:
    pool = await create_pool(database_url)
    try:
        rows = await pool.fetch("SELECT direction, gpu_model, nodes FROM scale_decisions ORDER BY id")
        return [tuple(r) for r in rows]
    finally:
        await pool.close()


async def test_utilization_samples_older_than_the_retention_are_deleted(database_url):
    from datetime import timedelta

    from gpusched_common.db import connect
    from gpusched_core.metrics.views import GroupView
    from services.metrics.store import record_utilization

    conn = await connect(database_url)
    try:
        now = datetime(2026, 12, 2, tzinfo=timezone.utc)
        view = GroupView("cluster", gpus_total=8, gpus_reporting=8, gpus_busy=4, utilization_sum_pct=400.0)
        for days_ago in (40, 31, 29, 1):
            await record_utilization(conn, now - timedelta(days=days_ago), view)
        await record_utilization(conn, now, view, keep_s=30 * 86_400)
        kept = [r["sampled_at"] for r in await conn.fetch("SELECT sampled_at FROM cluster_utilization ORDER BY 1")]
        assert kept == [now - timedelta(days=29), now - timedelta(days=1), now]
    finally:
        await conn.close()


async def test_the_telemetry_consumer_waits_out_a_database_that_refuses_connections(settings, caplog):
    """A PostgreSQL restart ends the pool's connections, and for a while the server refuses new ones ("the
    database system is starting up"; here the database refuses them, which asyncpg raises the same way): the
    telemetry consumer, which reads node keys from the store, waits and goes on instead of dying."""
    topic = NODES_TELEMETRY.name
    database = settings.database_url.rsplit("/", 1)[1]
    pool = await create_pool(settings.database_url)
    admin = await connect(settings.database_url.rsplit("/", 1)[0] + "/postgres")
    consumer = TelemetryConsumer(settings, TelemetryTracker(), group_id=None, topic=topic, pool=pool)
    task = asyncio.create_task(consumer.run())
    try:
        await _send_telemetry(settings.kafka_bootstrap, topic, "00000000000000a1")
        await _until(task, lambda: consumer.refused.total() >= 1)  # read, its sender's key looked up, refused
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", database)
        await _send_telemetry(settings.kafka_bootstrap, topic, "00000000000000b2")
        await _until(task, lambda: any("lost the broker or the database" in r.getMessage() for r in caplog.records))
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await _until(task, lambda: consumer.refused.total() >= 2)  # read again from the start, both refused
    finally:
        await admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
        await admin.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await pool.close()


async def _send_telemetry(bootstrap: str, topic: str, key_id: str) -> None:
    now = datetime.now(timezone.utc)
    value = ev.make_envelope(ev.GpuTelemetry(node_id="node-t", sampled_at=now, samples=[]), event_id=key_id,
                             stream_id="node-node-t", occurred_at=now, producer="node-agent").model_dump_json().encode()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=b"node-t", headers=[(SENDER_HEADER, key_id.encode())])
    finally:
        await producer.stop()


async def _until(task: asyncio.Task, condition, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if task.done():
            raise AssertionError(f"the telemetry consumer ended: {task.exception()!r}")
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_the_backlog_is_counted_by_shape_in_the_store_and_its_jobs_alike_share_one_object(database_url):
    """The metrics service reads the waiting jobs as counts per shape (tenant, GPUs, the model they name or
    their reservation was charged to, reserved or not): with tens of thousands waiting it held a row and an
    object per job at every evaluation (about 1.1 KiB per waiting job in bench-growth)."""
    from gpusched_core.metrics.views import BacklogJob, backlog_by_model
    from services.metrics.store import load_snapshot

    conn = await connect(database_url)
    try:
        jobs = [(f"q{i}", "research", "Admitted", 1, "H100-80GB") for i in range(5)]  # waiting for quota
        jobs += [(f"r{i}", "research", "Queued", 2, None) for i in range(3)]  # reserved, charged to A100 below
        jobs += [("r9", "inference", "Queued", 4, "H100-80GB"), ("run", "research", "Running", 1, "H100-80GB"),
                 ("done", "research", "Succeeded", 1, "H100-80GB")]
        await conn.executemany("INSERT INTO jobs (job_id, tenant, status, version, gpus, gpu_model, updated_at)"
                               " VALUES ($1, $2, $3, 2, $4, $5, now())", jobs)
        await conn.executemany("INSERT INTO quota_policy_reservations (job_id, tenant, flavor, units) VALUES"
                               " ($1, $2, $3, 1)", [(f"r{i}", "research", "A100-80GB") for i in range(3)]
                               + [("r9", "inference", "H100-80GB")])
        snapshot = await load_snapshot(conn, "pool")
    finally:
        await conn.close()
    assert sorted(snapshot.pending, key=repr) == sorted(
        [BacklogJob("research", 1, "H100-80GB", quota_reserved=False)] * 5
        + [BacklogJob("research", 2, "A100-80GB")] * 3 + [BacklogJob("inference", 4, "H100-80GB")], key=repr)
    assert len({id(job) for job in snapshot.pending}) == 3  # one object per shape
    assert [(b.model, b.pending_jobs, b.pending_gpus, b.waiting_for_quota_gpus)
            for b in backlog_by_model(snapshot.pending)] == [("A100-80GB", 3, 6, 0), ("H100-80GB", 6, 4, 5)]
    assert snapshot.job_tenants == {"run": "research"}
