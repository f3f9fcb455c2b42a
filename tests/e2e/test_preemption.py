"""Preemption end to end on the local stack: a high-priority job that needs GPUs of a full node gets the
fewest victims preempted within their grace period, runs on their GPUs, and the victims resume from the
checkpoints they wrote; every step is in each job's history with its reason."""

from __future__ import annotations

import asyncio

from gpusched_common.db import connect
from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.test_pipeline import job_view

STACK_ENV = {"GPUSCHED_PREEMPTION_GRACE_S": "5", "GPUSCHED_PREEMPTION_MIN_RUNTIME_S": "0"}

# Checkpoints every 0.2 s; on SIGTERM writes a final checkpoint and exits; resumed, it notes where from.
LOW_PRIORITY_JOB = (
    'if [ -n "$GPUSCHED_RESUME_FROM" ]; then echo "$GPUSCHED_RESUME_FROM" > "resumed-$GPUSCHED_JOB_ID"; exit 0; fi; '
    'trap \'echo "final-$GPUSCHED_JOB_ID" > "$GPUSCHED_CHECKPOINT_FILE"; exit 143\' TERM; '
    'i=0; while [ $i -lt 75 ]; do i=$((i+1)); echo "step-$i" > "$GPUSCHED_CHECKPOINT_FILE"; sleep 0.2; done'
)


async def test_a_high_priority_job_preempts_the_fewest_victims_which_resume_from_checkpoints(
        local_stack, stack_settings):
    low = a_job("x").tenant("research").gpus(2).model("H100-80GB").priority(0).command("sh", "-c", LOW_PRIORITY_JOB)
    async with Client(stack_settings) as client:
        lows = [await client.submit(low.spec()) for _ in range(4)]
        await wait_for_status(local_stack.database_url, lows, "Running")
        await asyncio.sleep(0.6)  # let them write a checkpoint or two
        high = await client.submit(a_job("x").tenant("inference").gpus(4).model("H100-80GB").priority(100)
                                   .command("sleep", "1").spec())
    await wait_until_finished(local_stack.database_url, [high], timeout_s=90, interval_s=0.3)
    hp = await job_view(local_stack.database_url, high)
    assert hp["status"] == "Succeeded"
    selected = next(e for e in hp["events"] if e["type"] == "VictimsSelected")["payload"]
    victims = selected["victims"]
    assert len(victims) == 2 and set(victims) <= set(lows), selected  # 4 GPUs: two 2-GPU jobs, no more

    await wait_until_finished(local_stack.database_url, lows, timeout_s=90, interval_s=0.5)
    for victim in victims:
        view = await job_view(local_stack.database_url, victim)
        types = [e["type"] for e in view["events"]]
        assert view["status"] == "Succeeded", view
        requested = next(e for e in view["events"] if e["type"] == "PreemptionRequested")["payload"]
        assert requested["preemptor_job_id"] == high and high in requested["reason"]
        preempted = next(e for e in view["events"] if e["type"] == "JobPreempted")["payload"]
        assert preempted["checkpoint_ref"] == f"final-{victim}"
        after = types[types.index("JobPreempted") + 1:]
        assert after[:2] == ["QuotaReleased", "QuotaReserved"] and "JobPlaced" in after
        resumed = (local_stack_agents(local_stack) / "jobs" / victim / f"resumed-{victim}").read_text().strip()
        assert resumed == f"final-{victim}"
    survivors = [j for j in lows if j not in victims]
    for job_id in survivors:
        types = [e["type"] for e in (await job_view(local_stack.database_url, job_id))["events"]]
        assert "PreemptionRequested" not in types


def local_stack_agents(state):
    from pathlib import Path

    return Path(state.home) / "agents" / "node-1"


async def wait_for_status(database_url: str, job_ids: list[str], status: str, timeout_s: float = 60) -> None:
    conn = await connect(database_url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while await conn.fetchval("SELECT count(*) FROM jobs WHERE job_id = ANY($1::text[]) AND status = $2",
                                  job_ids, status) < len(job_ids):
            assert asyncio.get_running_loop().time() < deadline, f"jobs not {status} in time"
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def test_killing_the_preemption_service_and_the_agent_mid_protocol_loses_no_job(local_stack, stack_settings):
    import os
    import signal

    from gpusched_cli import stack

    low = a_job("x").tenant("research").gpus(2).model("H100-80GB").priority(0).command("sh", "-c", LOW_PRIORITY_JOB)
    async with Client(stack_settings) as client:
        lows = [await client.submit(low.spec()) for _ in range(4)]
        await wait_for_status(local_stack.database_url, lows, "Running")
        os.kill(local_stack.processes["preemption"], signal.SIGKILL)
        high = await client.submit(a_job("x").tenant("inference").gpus(4).model("H100-80GB").priority(100)
                                   .command("sleep", "1").spec())
        await asyncio.sleep(1.0)
        stack.start_service(local_stack, "preemption", "services.preemption")
        await wait_for_event(local_stack.database_url, "PreemptionRequested", lows)
        os.kill(local_stack.processes["agent-node-1"], signal.SIGKILL)  # mid-grace
        await asyncio.sleep(1.0)
        stack.start_service(local_stack, "agent-node-1", "services.node_agent",
                            {"GPUSCHED_NODE_ID": "node-1", "GPUSCHED_SIMULATED_GPUS": "H100-80GB:8"})
        stack.save(local_stack)
    counts = await wait_until_finished(local_stack.database_url, [high, *lows], timeout_s=120, interval_s=0.5)
    assert counts == {"Succeeded": 5}
    conn = await connect(local_stack.database_url)
    try:
        preempted = await conn.fetch("SELECT stream_id, payload->>'checkpoint_ref' AS ref FROM events"
                                     " WHERE type = 'JobPreempted' AND stream_id = ANY($1::text[])",
                                     [f"job-{j}" for j in lows])
        assert len(preempted) == 2 and all(r["ref"] for r in preempted)  # resumed from a checkpoint
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 0
        assert await conn.fetchval("SELECT count(*) FROM gpu_nominations") == 0
    finally:
        await conn.close()


async def wait_for_event(database_url: str, event_type: str, job_ids: list[str], timeout_s: float = 60) -> None:
    conn = await connect(database_url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await conn.fetchval("SELECT 1 FROM events WHERE type = $1 AND stream_id = ANY($2::text[]) LIMIT 1",
                                      event_type, [f"job-{j}" for j in job_ids]):
            assert asyncio.get_running_loop().time() < deadline, f"no {event_type} in time"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


SLOW_TO_STOP = 'trap "sleep 4; exit 143" TERM; while true; do sleep 0.2; done'


async def test_a_job_cancelled_while_it_is_being_preempted_ends_cancelled_once(local_stack):
    import time

    from gpusched import Client as GatewayClient
    from tests.e2e.test_job_control import allocations, token_for, wait_state

    user = await token_for(local_stack, "user", "research", "frank")
    urgent = await token_for(local_stack, "user", "inference", "grace")
    with GatewayClient(local_stack.gateway, user) as client, GatewayClient(local_stack.gateway, urgent) as other:
        lows = [client.submit({"gpus": 4, "gpu_model": "H100-80GB", "command": ["sh", "-c", SLOW_TO_STOP]})["job_id"]
                for _ in range(2)]
        for job_id in lows:
            await wait_state(client, job_id, "Running")
        high = other.submit({"gpus": 4, "gpu_model": "H100-80GB", "priority": 100, "command": ["true"]})["job_id"]
        deadline = time.monotonic() + 60
        while not (victims := [j for j in lows if client.job(j)["state"] == "Preempting"]):
            assert time.monotonic() < deadline, "no job was preempted"
            await asyncio.sleep(0.1)
        victim = victims[0]
        assert client.cancel(victim, "not worth resuming")["cancel"] == "requested"
        ended = await wait_state(client, victim, "Cancelled", timeout_s=60)
        types = [e["type"] for e in ended["events"]]
        assert types.count("JobCancelled") == 1 and "JobPreempted" not in types and "JobRequeued" not in types
        assert await allocations(local_stack, victim) == 0
        assert (await wait_state(other, high, "Succeeded", timeout_s=60))["state"] == "Succeeded"
        for job_id in lows:
            client.cancel(job_id)
        for job_id in lows:
            await wait_state(client, job_id, "Cancelled", timeout_s=60)
