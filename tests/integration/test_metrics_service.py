"""The metrics service on the real broker and PostgreSQL: a job's telemetry from a simulated agent reaches
the Prometheus endpoint, and a backlog the cluster cannot place yields exactly one scale-out decision,
published through the outbox with its evidence."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

from gpusched_common.db import create_pool
from gpusched_common.runtime import running
from gpusched_common.topics import CLUSTER_SCALING

from services.metrics.handlers import MetricsService
from services.metrics.settings import MetricsSettings
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
