"""Node agents on the real broker with the simulated NVML backend: a restarted agent adopts its running
job, an XID fault produces a health report that cordons the GPU, a fleet answers for many nodes."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone

from gpusched_common import events as ev
from gpusched_common.messaging import build_broker, publish
from gpusched_common.runtime import running
from gpusched_common.topics import NODES_COMMANDS, NODES_REPORTS

from services.node_agent.app import agent_setup
from services.node_agent.faults import Fault
from tests.integration.kafka_helpers import read_topic


async def send_command(settings, payload: ev.Payload, node_id: str) -> None:
    broker = build_broker(settings, "test-placement")
    await broker.connect()
    try:
        envelope = ev.make_envelope(payload, event_id=f"cmd-{getattr(payload, 'job_id', payload.TYPE)}-{uuid.uuid4()}",
                                    stream_id=f"node-{node_id}",
                                    occurred_at=datetime.now(timezone.utc), producer="test")
        await publish(broker, NODES_COMMANDS.name, node_id, envelope.model_dump_json().encode(),
                      {"event-type": payload.TYPE})
    finally:
        await broker.stop()


def start_job(job_id: str, node_id: str, *command: str, gpus=(0,)) -> ev.StartJob:
    return ev.StartJob(job_id=job_id, node_id=node_id, tenant="t", gpu_indices=list(gpus),
                       gpu_uuids=[f"GPU-{i}" for i in gpus], command=list(command))


async def reports(settings, expect: int, timeout_s: float = 15.0, until=None) -> list[dict]:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        records = await read_topic(settings.kafka_bootstrap, NODES_REPORTS.name, expect=expect, timeout_s=1.0)
        found = [json.loads(r.value) for r in records]
        if (until is None or until(found)) and len(found) >= expect or asyncio.get_running_loop().time() > deadline:
            return found


def of(found: list[dict], kind: str, job_id: str | None = None) -> list[dict]:
    return [m["payload"] for m in found if m["type"] == kind and (job_id is None or m["payload"].get("job_id") == job_id)]


async def test_a_restarted_agent_adopts_its_running_job_and_reports_one_exit(settings, make_agent_settings, tmp_path):
    agent_settings = make_agent_settings(node_id="node-a", heartbeat_interval_s=0.5,
                                         telemetry_interval_s=60.0)
    go = tmp_path / "go"
    job = start_job("long", "node-a", "sh", "-c", f'while [ ! -f "{go}" ]; do sleep 0.05; done; exit 4')
    setup, _ = agent_setup(agent_settings)
    async with running("node-agent-a", agent_settings, setup, uses_database=False):
        await send_command(settings, job, "node-a")
        found = await reports(settings, 2, until=lambda f: of(f, "JobStartReported", "long"))
        assert of(found, "JobStartReported", "long")
    # the agent process is gone; its job still runs. A new agent process starts on the same node.
    setup, _ = agent_setup(agent_settings)
    async with running("node-agent-a", agent_settings, setup, uses_database=False):
        await reports(settings, 3, until=lambda f: len(of(f, "NodeRegistered")) == 2)
        await send_command(settings, job, "node-a")  # redelivered: must not start it twice
        go.touch()
        found = await reports(settings, 4, timeout_s=20.0, until=lambda f: of(f, "JobExitReported", "long"))
    registrations = of(found, "NodeRegistered")
    assert [r["running_jobs"] for r in registrations] == [[], ["long"]]
    assert registrations[1]["lease_epoch"] == registrations[0]["lease_epoch"] + 1
    # one run: the repeat is at most answered with that run's start again (the same process), never a second
    assert len({s["pid"] for s in of(found, "JobStartReported", "long")}) == 1
    assert [(e["exit_code"], e["reason_code"]) for e in of(found, "JobExitReported", "long")] == [(4, None)]


async def test_an_xid_fault_produces_a_health_report_and_the_gpu_is_refused_for_new_jobs(settings, make_agent_settings):
    agent_settings = make_agent_settings(
        node_id="node-x", simulated_gpus="A100-80GB:2", health_interval_s=0.2,
        telemetry_interval_s=60.0, fence_grace_s=0.4)
    setup, built = agent_setup(agent_settings)
    async with running("node-agent-x", agent_settings, setup, uses_database=False):
        await send_command(settings, start_job("victim", "node-x", "sleep", "30", gpus=(1,)), "node-x")
        await reports(settings, 2, until=lambda f: of(f, "JobStartReported", "victim"))
        built[0].agents["node-x"].backend.inject(Fault("xid", 1, 48))  # a double-bit ECC error on GPU 1
        found = await reports(settings, 4, until=lambda f: of(f, "JobExitReported", "victim"))
        await send_command(settings, start_job("late", "node-x", "true", gpus=(1,)), "node-x")
        found = await reports(settings, 5, until=lambda f: of(f, "JobExitReported", "late"))
    health = of(found, "GpuHealthChanged")
    assert [(h["gpu_index"], h["healthy"], h["status"], h["xid"], h["job_ids"], h["job_action"]) for h in health] == [
        (1, False, "unhealthy", 48, ["victim"], "stopped")]
    assert of(found, "JobExitReported", "victim")[0]["reason_code"] == "gpu_unhealthy"
    assert of(found, "JobExitReported", "late")[0]["reason_code"] == "gpu_unhealthy"
    types = [m["type"] for m in found]
    assert types.index("GpuHealthChanged") < types.index("JobExitReported")  # cordon before the GPU frees up


async def test_one_process_runs_a_fleet_of_simulated_nodes(settings, make_agent_settings):
    fleet_settings = make_agent_settings(node_id="sim", simulated_nodes=20,
                                         telemetry_interval_s=60.0, heartbeat_interval_s=60.0)
    setup, built = agent_setup(fleet_settings)
    async with running("node-agent-fleet", fleet_settings, setup, uses_database=False):
        found = await reports(settings, 20, until=lambda f: len(of(f, "NodeRegistered")) >= 20)
        await send_command(settings, start_job("on-17", "sim-017", "true"), "sim-017")
        found = await reports(settings, 22, until=lambda f: of(f, "JobExitReported", "on-17"))
    assert sorted(r["node_id"] for r in of(found, "NodeRegistered")) == [f"sim-{i:03d}" for i in range(1, 21)]
    assert of(found, "JobExitReported", "on-17")[0]["node_id"] == "sim-017"
    assert len(built[0].agents) == 20


async def test_an_exit_report_the_store_never_got_is_sent_again_when_the_node_is_reconciled(settings,
                                                                                          make_agent_settings):
    agent_settings = make_agent_settings(node_id="node-r", heartbeat_interval_s=0.5, telemetry_interval_s=60.0)
    setup, _ = agent_setup(agent_settings)
    async with running("node-agent-r", agent_settings, setup, uses_database=False):
        found = await reports(settings, 1, until=lambda f: of(f, "NodeRegistered"))
        epoch = of(found, "NodeRegistered")[0]["lease_epoch"]
        await send_command(settings, start_job("short", "node-r", "sh", "-c", "exit 5"), "node-r")
        found = await reports(settings, 3, until=lambda f: of(f, "JobExitReported", "short"))
        # the report was taken by the broker (the agent marked it sent), then lost with the broker's data:
        # the store still has the job running there, and placement reconciles the node
        await send_command(settings, ev.ReconcileJobs(node_id="node-r", job_ids=["short"], lease_epoch=epoch),
                           "node-r")
        found = await reports(settings, 4, until=lambda f: len(of(f, "JobExitReported", "short")) == 2)
    first, again = of(found, "JobExitReported", "short")
    assert (again["exit_code"], again["attempt"], again["lease_epoch"]) == (5, 1, epoch)
    assert again == first  # the same report, sent again (placement takes a report of an ended run as nothing new)
