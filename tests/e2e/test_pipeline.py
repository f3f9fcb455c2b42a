"""End to end on the local stack: real broker, real PostgreSQL, every service a process."""

from __future__ import annotations

import asyncio
import json

from gpusched_common.db import connect
from gpusched_common.topics import DEADLETTER
from gpusched_cli import stack
from gpusched_cli.client import Client, submission_bytes
from gpusched_cli.queries import get_job
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.conftest import read_spans
from tests.integration.kafka_helpers import read_topic


async def job_view(database_url: str, job_id: str) -> dict:
    conn = await connect(database_url)
    try:
        return await get_job(conn, job_id)
    finally:
        await conn.close()


async def test_a_submitted_job_succeeds_and_its_spans_form_one_trace(local_stack, stack_settings):
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("x").gpus(2).model("H100-80GB")
                                     .command("sh", "-c", 'test "$CUDA_VISIBLE_DEVICES" = "0,1"').spec())
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=60, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    for _ in range(100):  # the quota release follows the terminal event
        if job["events"][-1]["type"] == "QuotaReleased":
            break
        await asyncio.sleep(0.1)
        job = await job_view(local_stack.database_url, job_id)
    assert job["status"] == "Succeeded", job
    assert [e["type"] for e in job["events"]] == [
        "JobSubmitted", "JobAdmitted", "QuotaReserved", "JobPlaced", "JobStarted", "JobSucceeded", "QuotaReleased"]
    assert job["node_id"] == "node-1"  # the H100 node

    await asyncio.sleep(0.5)  # the agent's last span ends after its report
    spans = [s for s in read_spans(local_stack.home)
             if s["attributes"].get("gpusched.job_id") == job_id or s["attributes"].get("gpusched.key") == job_id]
    trace_ids = {s["trace_id"] for s in spans}
    assert len(trace_ids) == 1, trace_ids
    trace_id = trace_ids.pop()
    services = {s["service"] for s in read_spans(local_stack.home) if s["trace_id"] == trace_id}
    assert {"admission", "quota", "placement", "node-agent-node-1"} <= services, services


async def test_a_job_whose_command_exits_non_zero_ends_failed_with_the_exit_code(local_stack, stack_settings):
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("x").command("sh", "-c", "exit 7").spec())
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=60, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    assert (job["status"], job["exit_code"]) == ("Failed", 7)
    assert job["reasons"] == ["command exited with code 7"]


async def test_bad_submissions_are_rejected_with_reasons_and_the_pipeline_carries_on(local_stack, stack_settings):
    unknown_field = json.loads(submission_bytes(a_job("x").spec(), "bad-field"))
    unknown_field["payload"]["spec"]["gpuz"] = 1
    oversized = submission_bytes(a_job("x").command("echo", "y" * (1024 * 1024 + 10)).spec(), "bad-size")
    async with Client(stack_settings) as client:
        await client.submit_raw("junk", b"\x00not json at all")
        await client.submit_raw("bad-field", json.dumps(unknown_field).encode(), sign_as="team-a")
        await client.submit_raw("bad-size", oversized, sign_as="team-a")
        bad_model = await client.submit(a_job("x").model("B9000").gpus(-1).spec())
        good = await client.submit(a_job("x").spec())
    ids = ["bad-field", "bad-size", bad_model, good]
    await wait_until_finished(local_stack.database_url, ids, timeout_s=60, interval_s=0.2)
    views = {i: await job_view(local_stack.database_url, i) for i in ids}
    assert views["bad-field"]["status"] == "Rejected"
    assert views["bad-field"]["reasons"] == ["unknown field 'spec.gpuz'"]
    assert views["bad-size"]["status"] == "Rejected"
    assert "limit is 1048576 bytes" in views["bad-size"]["reasons"][0]
    assert views[bad_model]["reasons"][0] == "gpus must be at least 1, got -1"
    assert views[bad_model]["reasons"][1].startswith("unknown GPU model 'B9000': no registered node has B9000 (the "
                                                     "cluster has: ")
    assert views[good]["status"] == "Succeeded"
    dead = await read_topic(local_stack.kafka_bootstrap, DEADLETTER.name, expect=1)
    assert [r.value for r in dead] == [b"\x00not json at all"]


async def test_killing_services_with_sigkill_loses_no_job_and_places_none_twice(local_stack, stack_settings):
    import os
    import signal

    specs = [a_job("x").tenant(f"kill-{i % 3}").gpus(1 + i % 2).command("sleep", "0.3").spec() for i in range(40)]
    async with Client(stack_settings) as client:
        ids = [await client.submit(spec) for spec in specs[:20]]
        for name in ("admission", "quota", "placement", "agent-node-2"):
            os.kill(local_stack.processes[name], signal.SIGKILL)
        ids += [await client.submit(spec) for spec in specs[20:]]
        await asyncio.sleep(0.5)
        for name, module in (("admission", "services.admission"), ("quota", "services.quota"),
                             ("placement", "services.placement")):
            stack.start_service(local_stack, name, module)
        stack.start_service(local_stack, "agent-node-2", "services.node_agent",
                            {"GPUSCHED_NODE_ID": "node-2", "GPUSCHED_SIMULATED_GPUS": "A100-80GB:8"})
        stack.save(local_stack)
    counts = await wait_until_finished(local_stack.database_url, ids, timeout_s=120, interval_s=0.5)
    assert counts == {"Succeeded": 40}
    conn = await connect(local_stack.database_url)
    try:
        placed_twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT stream_id FROM events WHERE type = 'JobPlaced'"
            " AND stream_id = ANY($1::text[]) GROUP BY stream_id HAVING count(*) > 1) t",
            [f"job-{i}" for i in ids])
        assert placed_twice == 0
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 0
        for _ in range(100):  # quota releases follow the terminal events
            if await conn.fetchval("SELECT sum(reserved_units) FROM quota_policy_usage") == 0:
                break
            await asyncio.sleep(0.1)
        assert await conn.fetchval("SELECT sum(reserved_units) FROM quota_policy_usage") == 0
    finally:
        await conn.close()


async def test_work_whose_wake_up_message_was_lost_is_placed_from_the_store(local_stack, stack_settings):
    from gpusched_core import lifecycle
    from gpusched_common.jobs import append_job_events, load_job
    from tests.builders import T0

    conn = await connect(local_stack.database_url)
    try:
        # a job reserved quota, but the QuotaReserved message never reached placement: only the store knows
        async with conn.transaction():
            state = await load_job(conn, "lost-wakeup")
            spec = a_job("x").spec()
            state = await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, T0),
                                                                        T0), producer="test", now=T0)
            await append_job_events(conn, state, lifecycle.decide(state, lifecycle.ReserveQuota(1, 16), T0),
                                    producer="test", now=T0)
            await conn.execute("DELETE FROM outbox WHERE producer = 'test'")  # the messages are lost
            await conn.execute("INSERT INTO quota_policy_reservations VALUES ('lost-wakeup', 'guests', 'H100-80GB', 7000)")
            await conn.execute("UPDATE quota_policy_usage SET reserved_units = reserved_units + 7000"
                               " WHERE tenant = 'guests' AND flavor = 'H100-80GB'")
            await conn.execute("INSERT INTO placement_pending (job_id, tenant, gpus, priority) VALUES"
                               " ('lost-wakeup', 'team-a', 1, 0)")
    finally:
        await conn.close()
    await wait_until_finished(local_stack.database_url, ["lost-wakeup"], timeout_s=60, interval_s=0.3)
    job = await job_view(local_stack.database_url, "lost-wakeup")
    for _ in range(50):
        if job["events"][-1]["type"] == "QuotaReleased":
            break
        await asyncio.sleep(0.1)
        job = await job_view(local_stack.database_url, "lost-wakeup")
    assert job["status"] == "Succeeded" and job["events"][-1]["type"] == "QuotaReleased"
