"""A table of forgeries on the real stack (issue 14): each row a message a plain Kafka client sends with no
credential (or with another node's key) on one topic, with one forged field; every consumer reads each
(its group's committed offset passes it: the positive signal) and none of them has any effect: no
process starts, the running job keeps running with its GPUs and its quota, no node changes or is
quarantined, nobody is preempted, no job or tenancy revision appears. Afterwards every consumer still
works: a new job runs to its end and the long one is cancelled by its agent."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpusched import Client
from gpusched_cli.workload import wait_until_finished
from gpusched_common import events as ev
from gpusched_common import signing
from gpusched_common.db import connect
from gpusched_common.partitioning import partition_for
from gpusched_common import topics as t
from tests.builders import a_job
from tests.e2e.test_job_control import token_for, wait_state

STACK_NODES = 2
STACK_GPU_MODELS = ["H100-80GB"]
STACK_GPUS_PER_NODE = 4
NOW = datetime.now(timezone.utc)


def envelope(payload: ev.Payload, stream: str, version: int | None = None) -> bytes:
    return ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=stream, stream_version=version,
                            occurred_at=datetime.now(timezone.utc), producer="forger").model_dump_json().encode()


def forgeries(job: str, node: str, other: str, epoch: int, marker: Path, other_key) -> list[tuple[str, str, tuple[str, ...], str, bytes, dict]]:
    """(row, topic, the groups that read it, key, value, headers): one forged message each."""
    start = ev.StartJob(job_id="forged-start", node_id=node, tenant="research", gpu_indices=[0], gpu_uuids=["x"],
                        command=["touch", str(marker)], lease_epoch=epoch)
    rows: list[tuple[str, str, tuple[str, ...], str, bytes, dict]] = []

    def row(name: str, topic: t.Topic, groups: tuple[str, ...], key: str, value: bytes, headers: dict | None = None):
        rows.append((name, topic.name, groups, key, value, headers or {}))

    agent = (t.agent_group(node),)
    row("StartJob unsigned runs a command", t.NODES_COMMANDS, agent, node, envelope(start, f"node-{node}"))
    _, stranger = signing.new_key()
    value = envelope(start, f"node-{node}")
    row("StartJob signed by a stranger", t.NODES_COMMANDS, agent, node, value,
        signing.Signer(stranger).headers(t.NODES_COMMANDS.name, value))
    row("ReconcileJobs [] stops every job", t.NODES_COMMANDS, agent, node,
        envelope(ev.ReconcileJobs(node_id=node, job_ids=[], lease_epoch=epoch), f"node-{node}"))
    exit_ok = ev.JobExitReported(job_id=job, node_id=node, exit_code=0, runtime_s=1.0, lease_epoch=epoch, attempt=1)
    placement = (t.GROUP_PLACEMENT_NODES,)
    row("JobExitReported 0 ends a running job", t.NODES_REPORTS, placement, node, envelope(exit_ok, f"node-{node}"))
    value = envelope(exit_ok, f"node-{node}")
    row("JobExitReported signed by another node", t.NODES_REPORTS, placement, node, value,
        signing.Signer(other_key).headers(t.NODES_REPORTS.name, value))
    bad_inventory = ev.NodeRegistered(node_id=node, hostname=node, cpu_milli=1000, memory_mib=1024,
                                      nvml_backend="simulated", lease_epoch=epoch + 1, gpus=[
                                          ev.GpuInventory(index=i, uuid=f"f-{i}", model="H100-80GB", memory_mib=81559)
                                          for i in (5, 7)])
    row("NodeRegistered with GPU indices 5, 7", t.NODES_REPORTS, placement, node, envelope(bad_inventory, f"node-{node}"))
    row("NodeHeartbeat with a lease of 1e14 s", t.NODES_REPORTS, placement, other, envelope(ev.NodeHeartbeat(
        node_id=other, running_jobs=[], lease_epoch=epoch + 5, lease_ttl_s=1e14, fence_grace_s=10), f"node-{other}"))
    row("GpuTelemetry at 100%", t.NODES_TELEMETRY, (t.GROUP_METRICS,), node, envelope(ev.GpuTelemetry(
        node_id=node, sampled_at=datetime.now(timezone.utc), samples=[ev.GpuSample(
            index=0, uuid="f", utilization_pct=100.0, memory_used_mib=1, memory_total_mib=81559, power_w=1.0,
            temperature_c=30.0, sm_clock_mhz=1)]), f"node-{node}"))
    job_events = (t.GROUP_QUOTA, t.GROUP_PLACEMENT_JOBS, t.GROUP_PREEMPTION)
    row("JobCancelled frees the job's GPUs", t.JOBS_EVENTS, job_events, job,
        envelope(ev.JobCancelled(job_id=job, reason="forged"), f"job-{job}", 99))
    row("QuotaReleased refunds the job's units", t.JOBS_EVENTS, job_events, job, envelope(ev.QuotaReleased(
        job_id=job, tenant="research", gpus=4, tenant_reserved_gpus=0), f"job-{job}", 98))
    row("ReclaimRequested names a borrower", t.QUOTA_RECLAIMS, (t.GROUP_PREEMPTION_RECLAIMS,), "inference",
        envelope(ev.ReclaimRequested(tenant="inference", cohort="local", flavor="H100-80GB", gpus=4, for_jobs=["x"],
                                     borrowers=[ev.ReclaimBorrower(tenant="research", borrowed_gpus=4)],
                                     reason="forged", requested_at=NOW), "reclaim-inference"))
    control = (t.GROUP_ADMISSION_CONTROL, t.GROUP_PLACEMENT_CONTROL)
    row("CancelJob with no producer", t.JOBS_CONTROL, control, job,
        envelope(ev.CancelJob(job_id=job, reason="forged", requested_by="user:research:alice"), f"job-{job}"))
    row("CordonNode with no producer", t.JOBS_CONTROL, control, node,
        envelope(ev.CordonNode(node_id=node, cordon=True, reason="forged", requested_by="operator"), f"node-{node}"))
    spec = a_job("forged-sub").tenant("research").gpus(4).spec()
    row("JobSubmitted with no credential", t.JOBS_SUBMITTED, (t.GROUP_ADMISSION,), "forged-sub", envelope(
        ev.JobSubmitted(job_id="forged-sub", spec=spec, submitted_at=NOW - timedelta(days=30)), "job-forged-sub"))
    row("TenancyUpdated with no operator key", t.TENANCY_UPDATES, (t.GROUP_QUOTA_ADMIN,), "tenancy", envelope(
        ev.TenancyUpdated(revision=999, document="revision: 999\ncohorts: []\n", published_at=NOW), "tenancy"))
    return rows


async def committed_past(bootstrap: str, group: str, topic: str, partition: int, offset: int,
                         timeout_s: float = 60.0) -> None:
    """Wait until ``group`` committed an offset past ``offset`` (it read the message and moved on)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        tp = TopicPartition(topic, partition)
        while True:
            position = await consumer.committed(tp)
            if position is not None and position > offset:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"{group} did not read {topic}[{partition}]@{offset} within {timeout_s}s "
                                     f"(committed {position})")
            await asyncio.sleep(0.3)
    finally:
        await consumer.stop()


async def snapshot(database_url: str, job: str) -> dict:
    conn = await connect(database_url)
    try:
        return {
            "job": await conn.fetchval("SELECT status FROM jobs WHERE job_id = $1", job),
            "allocations": await conn.fetchval("SELECT count(*) FROM gpu_allocations WHERE job_id = $1", job),
            "usage": [tuple(r) for r in await conn.fetch("SELECT * FROM quota_policy_usage ORDER BY 1, 2, 3")],
            "nodes": [tuple(r) for r in await conn.fetch(
                "SELECT node_id, status, lease_epoch, cordoned_at, quarantine_reasons FROM nodes ORDER BY 1")],
            "gpus": await conn.fetchval("SELECT count(*) FROM gpus"),
            "preemptions": await conn.fetchval(
                "SELECT count(*) FROM events WHERE type IN ('PreemptionRequested', 'JobPreempted', 'VictimsSelected')"),
            "forged jobs": await conn.fetchval("SELECT count(*) FROM jobs WHERE job_id LIKE 'forged%'"),
            "revisions": await conn.fetchval("SELECT count(*) FROM quota_tenancy_revisions"),
            "rejections": await conn.fetchval("SELECT count(*) FROM quota_tenancy_rejections"),
            "job events": await conn.fetchval("SELECT count(*) FROM events WHERE stream_id = $1", f"job-{job}"),
        }
    finally:
        await conn.close()


async def test_no_forged_message_on_any_topic_has_an_effect(local_stack, tmp_path):
    token = await token_for(local_stack, "user", "research", "alice")
    with Client(local_stack.gateway, token) as client:
        job = client.submit({"gpus": 4, "command": ["sleep", "600"], "name": "victim"})["job_id"]
        await wait_state(client, job, "Running")
        conn = await connect(local_stack.database_url)
        try:
            node = await conn.fetchval("SELECT DISTINCT node_id FROM gpu_allocations WHERE job_id = $1", job)
            epoch = await conn.fetchval("SELECT lease_epoch FROM nodes WHERE node_id = $1", node)
        finally:
            await conn.close()
        other = next(n for n in local_stack.node_ids if n != node)
        other_key = signing.load_key(Path(local_stack.home) / "agents" / other / "node.key")
        before = await snapshot(local_stack.database_url, job)
        marker = tmp_path / "forged-start-ran"

        producer = AIOKafkaProducer(bootstrap_servers=local_stack.kafka_bootstrap)  # no credential at all
        await producer.start()
        sent = []
        try:
            for name, topic, groups, key, value, headers in forgeries(job, node, other, epoch, marker, other_key):
                meta = await producer.send_and_wait(topic, value, key=key.encode(),
                                                    headers=[(k, v.encode()) for k, v in headers.items()])
                sent.append((name, topic, groups, meta.partition, meta.offset))
        finally:
            await producer.stop()
        for name, topic, groups, partition, offset in sent:
            for group in groups:
                await committed_past(local_stack.kafka_bootstrap, group, topic, partition, offset)

        after = await snapshot(local_stack.database_url, job)
        assert after == before, json.dumps({k: (before[k], after[k]) for k in before if before[k] != after[k]},
                                           default=str)
        assert not marker.exists()
        conn = await connect(local_stack.database_url)
        try:
            refused = {(r["receiver"], r["reason"]): r["refused"] for r in await conn.fetch(
                "SELECT receiver, reason, sum(refused)::int AS refused FROM refused_messages GROUP BY 1, 2")}
        finally:
            await conn.close()
        assert refused.get(("placement", "unsigned"), 0) >= 3  # the exit, the inventory, the heartbeat
        assert refused.get(("placement", "other-node"), 0) >= 1  # node `other` speaking for `node`
        assert refused.get(("quota", "unauthenticated"), 0) >= 1  # the tenancy update
        agent_log = (Path(local_stack.home) / "logs" / f"agent-{node}.log").read_text()
        assert "node commands no trusted sender signed" in agent_log

        # every consumer still works: a new job runs to its end; the long one is still its agent's to stop
        fresh = client.submit({"gpus": 4, "command": ["true"]})["job_id"]
        await wait_until_finished(local_stack.database_url, [fresh], timeout_s=90, interval_s=0.3)
        assert client.job(fresh)["state"] == "Succeeded"
        client.cancel(job)
        await wait_state(client, job, "Cancelled", timeout_s=60)


@pytest.mark.parametrize("kind", ["metrics"])
async def test_forged_telemetry_is_counted_by_metrics(local_stack, kind):
    """Metrics writes its refusals with each evaluation (every second here): the forged telemetry of the
    table above, or any sent now, shows there."""
    producer = AIOKafkaProducer(bootstrap_servers=local_stack.kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(t.NODES_TELEMETRY.name, envelope(ev.GpuTelemetry(
            node_id=local_stack.node_ids[0], sampled_at=datetime.now(timezone.utc), samples=[]), "node-x"), key=b"x")
    finally:
        await producer.stop()
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        conn = await connect(local_stack.database_url)
        try:
            n = await conn.fetchval("SELECT sum(refused) FROM refused_messages WHERE receiver = $1", kind)
        finally:
            await conn.close()
        if n:
            return
        assert asyncio.get_running_loop().time() < deadline, "metrics counted no refused telemetry"
        await asyncio.sleep(0.5)


READERS = {
    t.NODES_REPORTS.name: (t.GROUP_PLACEMENT_NODES,),
    t.NODES_TELEMETRY.name: (t.GROUP_METRICS,),
    t.JOBS_EVENTS.name: (t.GROUP_QUOTA, t.GROUP_PLACEMENT_JOBS, t.GROUP_PREEMPTION),
    t.QUOTA_RECLAIMS.name: (t.GROUP_PREEMPTION_RECLAIMS,),
    t.JOBS_CONTROL.name: (t.GROUP_ADMISSION_CONTROL, t.GROUP_PLACEMENT_CONTROL),
    t.JOBS_SUBMITTED.name: (t.GROUP_ADMISSION,),
    t.TENANCY_UPDATES.name: (t.GROUP_QUOTA_ADMIN,),
}


def junk(seed: int) -> list[bytes]:
    """Messages no consumer can use: unreadable, too deep, with a NUL, of unknown types and versions, and
    well-formed envelopes of every type whose payloads are random JSON (seeded: the same every run)."""
    import random

    rng = random.Random(seed)

    def value(depth: int = 0) -> object:
        kind = rng.randrange(7 if depth < 3 else 5)
        if kind == 0:
            return None
        if kind == 1:
            return rng.random() < 0.5
        if kind == 2:
            return rng.randrange(-2**70, 2**70)
        if kind == 3:
            return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(12)))
        if kind == 4:
            return rng.uniform(-1e300, 1e300)
        if kind == 5:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{i}": value(depth + 1) for i in range(rng.randrange(4))}

    def env(event_type: str, payload: object, version: object = 1) -> bytes:
        return json.dumps({"event_id": str(uuid.uuid4()), "type": event_type, "schema_version": version,
                           "stream_id": "fuzz", "occurred_at": "2026-12-01T00:00:00Z", "producer": "fuzz",
                           "payload": payload}).encode()

    corpus = [b"", b"not json", b"\xff\xfe", b"[" * 50_000 + b"]" * 50_000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
              env("NodeHeartbeat", {"node_id": "n\u0000", "running_jobs": []}), env("NoSuchType", {}),
              env("NodeHeartbeat", {"node_id": "n", "running_jobs": []}, 99), b"x" * 900_000]
    corpus += [env(rng.choice(sorted(ev.PAYLOAD_TYPES)), {f"f{i}": value() for i in range(rng.randrange(6))})
               for _ in range(30)]
    return corpus


async def test_fuzzed_messages_on_every_topic_leave_every_consumer_live(local_stack):
    producer = AIOKafkaProducer(bootstrap_servers=local_stack.kafka_bootstrap, max_request_size=2 * 1024 * 1024)
    await producer.start()
    last: dict[tuple[str, int], int] = {}
    try:
        for i, topic in enumerate([*READERS, t.NODES_COMMANDS.name]):
            for n, value in enumerate(junk(i)):
                key = local_stack.node_ids[n % len(local_stack.node_ids)]  # commands reach the agents' nodes
                meta = await producer.send_and_wait(topic, value, key=key.encode(), headers=[("event-type", b"x")])
                last[(topic, meta.partition)] = max(last.get((topic, meta.partition), -1), meta.offset)
        command_partitions = len(await producer.partitions_for(t.NODES_COMMANDS.name))
    finally:
        await producer.stop()

    def readers(topic: str, partition: int) -> tuple[str, ...]:
        if topic != t.NODES_COMMANDS.name:
            return READERS[topic]
        # an agent reads only the partition its node hashes to (issue 16)
        return tuple(t.agent_group(n) for n in local_stack.node_ids
                     if partition_for(n, command_partitions) == partition)

    for (topic, partition), offset in sorted(last.items()):
        assert readers(topic, partition), (topic, partition)
        for group in readers(topic, partition):
            await committed_past(local_stack.kafka_bootstrap, group, topic, partition, offset, timeout_s=120)
    for name, pid in local_stack.processes.items():  # nobody died of it
        assert Path(f"/proc/{pid}").exists(), f"{name} (pid {pid}) is gone"
    token = await token_for(local_stack, "user", "research", "fuzz-user")
    with Client(local_stack.gateway, await token_for(local_stack, "viewer", None, "fuzz-viewer")) as viewer:
        nodes = viewer.nodes()["nodes"]
    assert all({"cpu", "memory", "devices", "users", "environment"} <= set(n["isolation"]) for n in nodes), nodes
    with Client(local_stack.gateway, token) as client:
        job = client.submit({"gpus": 1, "command": ["true"]})["job_id"]
        await wait_until_finished(local_stack.database_url, [job], timeout_s=90, interval_s=0.3)
        assert client.job(job)["state"] == "Succeeded"
