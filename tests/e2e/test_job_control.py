"""Job control through the gateway, end to end on the local stack. Cancel: a waiting job ends Cancelled at once and
gives back its quota; a running one (and a gang, on every node) is stopped by its agents and ends Cancelled
only when they report it gone, then its GPUs are free; a finished job is answered as it is; a second cancel
changes nothing; another tenant's job is 404 and a teammate's 403; `gpusched cancel --state` with only a
server and a token. Hold and release: a held job leaves the line and comes back at its submission time;
`submit --hold`; only waiting jobs are held. `submit --wait` exits with the job's exit code."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime

import pytest

from gpusched import ApiError, Client
from gpusched_common import tokens
from gpusched_common.db import connect
from gpusched_cli.workload import wait_until_finished
from gpusched_cli.node_commands import enforced as enforced_by
from tests.e2e.test_gateway import cli

STACK_NODES = 2
STACK_GPU_MODELS = ["H100-80GB"]
STACK_GPUS_PER_NODE = 4


async def token_for(local_stack, role: str, tenant: str, name: str) -> str:
    conn = await connect(local_stack.database_url)
    try:
        text, _ = await tokens.issue(conn, role=role, tenant=tenant, name=name, expires_at=None, created_by="test",
                                     now=datetime.now(UTC))
    finally:
        await conn.close()
    return text


async def wait_state(client: Client, job_id: str, state: str | tuple[str, ...], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    wanted = (state,) if isinstance(state, str) else state
    while True:
        try:
            job = await asyncio.to_thread(client.job, job_id)
        except ApiError as exc:  # not recorded by admission yet
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
            continue
        if job["state"] in wanted and (job["state"] not in ("Admitted", "Queued") or job["reasons"]):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} is {job['state']}, not {state}, after {timeout_s}s: {job['reasons']}"
                                 f"\n{await _holders()}")
        await asyncio.sleep(0.2)


_DATABASE: list[str] = []  # the module's stack's database, for what a failed wait shows


@pytest.fixture(autouse=True)
def _remember_database(local_stack):
    _DATABASE[:] = [local_stack.database_url]


async def _holders() -> str:
    """Every job holding GPUs, with its events: what a job that waited in vain waited behind."""
    if not _DATABASE:
        return ""
    conn = await connect(_DATABASE[0])
    try:
        rows = await conn.fetch(
            "SELECT e.stream_id, e.type, e.recorded_at, e.payload FROM events e WHERE e.stream_id IN"
            " (SELECT DISTINCT 'job-' || job_id FROM gpu_allocations) ORDER BY e.global_position")
    finally:
        await conn.close()
    return "GPUs held by:\n" + "\n".join(f"{r['stream_id']} {r['recorded_at']:%H:%M:%S.%f} {r['type']} {r['payload']}"
                                         for r in rows)


async def _state(client: Client, job_id: str) -> str:
    try:
        return (await asyncio.to_thread(client.job, job_id))["state"]
    except ApiError as exc:
        if exc.status != 404:  # not recorded by admission yet
            raise
        return "Submitted"


async def first_running(client: Client, job_ids: list[str], timeout_s: float = 60) -> str:
    """The first of ``job_ids`` seen Running (jobs that reach admission on different partitions run in
    either order)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = {j: await _state(client, j) for j in job_ids}
        running = [j for j in job_ids if states[j] == "Running"]
        if running:
            return running[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"none of {job_ids} runs after {timeout_s}s: {states}\n{await _holders()}")
        await asyncio.sleep(0.2)


async def _one_running(client: Client, job_ids: list[str], timeout_s: float = 60) -> tuple[str, str]:
    """(the one of two jobs that runs, the other)."""
    running = await first_running(client, job_ids, timeout_s)
    return running, next(j for j in job_ids if j != running)


async def allocations(local_stack, job_id: str) -> int:
    conn = await connect(local_stack.database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM gpu_allocations WHERE job_id = $1", job_id)
    finally:
        await conn.close()


async def test_cancel_a_running_job_a_waiting_one_and_a_gang(local_stack):
    token = await token_for(local_stack, "user", "research", "alice")
    with Client(local_stack.gateway, token) as client:
        # sleep traps nothing: SIGTERM ends it; the ignoring one needs the grace and SIGKILL
        running = client.submit({"gpus": 4, "command": ["sleep", "600"], "name": "long"})["job_id"]
        stubborn = client.submit({"gpus": 4, "command": ["sh", "-c", "trap '' TERM; sleep 600"]})["job_id"]
        await wait_state(client, running, "Running")
        await wait_state(client, stubborn, "Running")
        waiting = client.submit({"gpus": 4, "command": ["true"]})["job_id"]  # no room: waits, with why
        await wait_state(client, waiting, ("Admitted", "Queued"))

        assert client.cancel(waiting, "changed my mind")["cancel"] == "requested"
        cancelled = await wait_state(client, waiting, "Cancelled")
        last = cancelled["events"][-2:] if cancelled["events"][-1]["type"] == "QuotaReleased" else cancelled["events"]
        assert any(e["type"] == "JobCancelled" and e["payload"]["reason"] == "changed my mind"
                   and e["payload"]["requested_by"].endswith(":alice") for e in last)

        asked = client.cancel(running)
        assert (asked["cancel"], asked["state"]) == ("requested", "Running")
        assert client.cancel(running)["cancel"] == "requested"  # twice: harmless
        done = await wait_state(client, running, "Cancelled")
        types = [e["type"] for e in done["events"]]
        assert types.index("JobCancelRequested") < types.index("JobCancelled")
        assert types.count("JobCancelled") == 1
        assert await allocations(local_stack, running) == 0

        client.cancel(stubborn)
        stopped = await wait_state(client, stubborn, "Cancelled", timeout_s=60)  # after the grace, SIGKILL
        assert await allocations(local_stack, stubborn) == 0
        assert "JobCancelRequested" in [e["type"] for e in stopped["events"]]

        gang = client.submit({"gpus": 2, "nodes": 2, "command": ["sleep", "600"]})["job_id"]
        gang_job = await wait_state(client, gang, "Running")
        assert await allocations(local_stack, gang) == 4, gang_job
        client.cancel(gang)
        ended = await wait_state(client, gang, "Cancelled")
        assert await allocations(local_stack, gang) == 0
        assert [e["type"] for e in ended["events"]].count("JobCancelled") == 1

        finished = client.submit({"gpus": 1, "command": ["true"]})["job_id"]
        await wait_until_finished(local_stack.database_url, [finished], timeout_s=60, interval_s=0.2)
        assert client.cancel(finished) == {"job_id": finished, "state": "Succeeded",
                                           "cancel": "nothing to cancel: the job already Succeeded"}


async def test_who_may_cancel_and_the_cli(local_stack):
    alice = await token_for(local_stack, "user", "inference", "alice-inf")
    bob = await token_for(local_stack, "user", "inference", "bob-inf")
    admin = await token_for(local_stack, "tenant-admin", "inference", "lead-inf")
    outsider = await token_for(local_stack, "user", "platform", "carol")
    with Client(local_stack.gateway, alice) as client:
        job = client.submit({"gpus": 1, "command": ["sleep", "600"]})["job_id"]
        await wait_state(client, job, "Running")  # recorded: a refusal below is about who asks, not timing
    with Client(local_stack.gateway, outsider) as client, pytest.raises(ApiError) as hidden:
        client.cancel(job)
    assert hidden.value.status == 404
    with Client(local_stack.gateway, bob) as client, pytest.raises(ApiError) as teammate:
        client.cancel(job)
    assert teammate.value.status == 403 and "it submitted them" in teammate.value.detail
    # the tenant's admin cancels every running job of the tenant, with the CLI and nothing but a token
    done = await asyncio.to_thread(cli, local_stack, admin, "cancel", "--state", "Running", "--json")
    assert done.returncode == 0, done.stderr
    assert [o["job_id"] for o in json.loads(done.stdout)] == [job]
    with Client(local_stack.gateway, alice) as client:
        await wait_state(client, job, "Cancelled")
    empty = await asyncio.to_thread(cli, local_stack, admin, "cancel")
    assert empty.returncode == 2 and "name the jobs" in empty.stderr


async def test_hold_keeps_a_job_out_of_line_and_release_puts_it_back_at_its_submission_time(local_stack):
    token = await token_for(local_stack, "user", "ml-eval", "dana")
    with Client(local_stack.gateway, token) as client:
        blocker = client.submit({"gpus": 4, "command": ["sleep", "600"]})["job_id"]
        other = client.submit({"gpus": 4, "command": ["sleep", "600"]})["job_id"]
        await wait_state(client, blocker, "Running")
        await wait_state(client, other, "Running")
        first = client.submit({"gpus": 4, "command": ["true"], "name": "first"})["job_id"]
        await wait_state(client, first, ("Admitted", "Queued"))
        second = client.submit({"gpus": 4, "command": ["true"], "name": "second"})["job_id"]
        await wait_state(client, second, ("Admitted", "Queued"))
        assert client.hold(first, "not yet")["hold"] == "requested"
        held = await wait_state(client, first, "Held")
        assert held["reasons"] == ["held: not yet"]
        assert first not in [j["job_id"] for j in client.queue()["jobs"]]
        with pytest.raises(ApiError) as not_held:
            client.release(second)
        assert not_held.value.status == 409
        assert client.release(first)["release"] == "requested"
        await wait_state(client, first, ("Admitted", "Queued"))
        client.cancel(blocker)  # room for one 4-GPU job: the first submitted goes first, though held since
        placed_first = await wait_state(client, first, "Succeeded")
        placed_second = await wait_state(client, second, "Succeeded")

        def placed_at(job: dict) -> str:
            return next(e["occurred_at"] for e in job["events"] if e["type"] == "JobPlaced")
        assert placed_at(placed_first) < placed_at(placed_second)
        parked = client.submit({"gpus": 1, "command": ["true"]}, hold=True)["job_id"]
        assert (await wait_state(client, parked, "Held"))["events"][-1]["type"] == "JobHeld"
        with pytest.raises(ApiError) as running_hold:
            client.hold(other)
        assert running_hold.value.status == 409 and "only a waiting job" in running_hold.value.detail
        for job_id in (other, parked):
            client.cancel(job_id)


async def test_submit_wait_exits_with_the_job_s_exit_code(local_stack):
    token = await token_for(local_stack, "user", "platform", "erin")
    failed = await asyncio.to_thread(cli, local_stack, token, "submit", "--wait", "--", "sh", "-c", "exit 7")
    assert failed.returncode == 7 and "JobFailed" in failed.stdout, failed.stderr
    ok = await asyncio.to_thread(cli, local_stack, token, "submit", "--wait", "--", "true")
    assert ok.returncode == 0 and "JobSucceeded" in ok.stdout, ok.stderr


async def test_cordon_keeps_new_work_off_a_node_until_uncordoned(local_stack):
    from pathlib import Path

    from gpusched.config import read_config

    operator = read_config(Path(local_stack.config_path))["token"]
    user = await token_for(local_stack, "user", "research", "frank")
    refused = await asyncio.to_thread(cli, local_stack, user, "cordon", "node-1")
    assert refused.returncode == 1 and "role user may not cordon nodes" in refused.stdout + refused.stderr
    done = await asyncio.to_thread(cli, local_stack, operator, "cordon", "node-1", "--reason", "firmware update")
    assert done.returncode == 0, done.stdout + done.stderr
    with Client(local_stack.gateway, operator) as admin:
        deadline = time.monotonic() + 30
        while not next(n for n in admin.nodes()["nodes"] if n["node_id"] == "node-1")["cordoned_at"]:
            assert time.monotonic() < deadline, "node-1 was not cordoned"
            await asyncio.sleep(0.2)
        assert admin.cordon("node-1")["cordon"] == "cordoned already"
        with pytest.raises(ApiError) as unknown:
            admin.cordon("node-99")
        assert unknown.value.status == 404
        with Client(local_stack.gateway, user) as client:
            submitted = [client.submit({"gpus": 4, "command": ["sleep", "600"]})["job_id"] for _ in range(2)]
            # the two reach admission on different partitions, in either order: whichever is placed first
            # takes node-2, the other waits for the cordoned node
            first, second = await _one_running(client, submitted)
            running = await wait_state(client, first, "Running")
            assert running["node_id"] == "node-2"
            table = await asyncio.to_thread(cli, local_stack, operator, "nodes")
            assert table.returncode == 0, table.stderr
            rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:] if line.strip()}
            assert "FREE/TOTAL GPUS" in table.stdout.splitlines()[0] and "ENFORCED" in table.stdout.splitlines()[0]
            enforced = enforced_by(next(n for n in admin.nodes()["nodes"] if n["node_id"] == "node-1")["isolation"])
            assert enforced in rows["node-1"]  # what the node enforces on its jobs, as its agent registered it
            assert "H100-80GB 0/4" in rows["node-2"] and "H100-80GB 4/4" in rows["node-1"]
            assert "Cordoned" in rows["node-1"] and "firmware update" in rows["node-1"] and "seen " in rows["node-1"]
            waiting = await wait_state(client, second, ("Admitted", "Queued"))
            assert waiting["node_id"] is None
            admin.uncordon("node-1")
            moved = await wait_state(client, second, "Running")
            assert moved["node_id"] == "node-1"
            for job_id in (first, second):
                client.cancel(job_id)
    conn = await connect(local_stack.database_url)
    try:
        history = await conn.fetch("SELECT type, payload FROM events WHERE stream_id = 'node-node-1' ORDER BY version")
    finally:
        await conn.close()
    assert [r["type"] for r in history] == ["NodeCordoned", "NodeUncordoned"]
    cordoned = history[0]["payload"] if isinstance(history[0]["payload"], dict) else json.loads(history[0]["payload"])
    assert cordoned["reason"] == "firmware update" and cordoned["requested_by"].startswith("token:")


async def test_a_job_ends_failed_at_its_time_limit(local_stack):
    token = await token_for(local_stack, "user", "research", "grace")
    with Client(local_stack.gateway, token) as client:
        job_id = client.submit({"gpus": 1, "command": ["sleep", "600"], "time_limit_s": 2})["job_id"]
        ended = await wait_state(client, job_id, "Failed", timeout_s=60)
        assert ended["reasons"] == ["time limit 2s reached"], ended
        started = next(e for e in ended["events"] if e["type"] == "JobStarted")
        failed = next(e for e in ended["events"] if e["type"] == "JobFailed")
        assert failed["payload"]["reason"] == "time limit 2s reached" and started["version"] < failed["version"]
        assert await allocations(local_stack, job_id) == 0
        with pytest.raises(ApiError) as bad:
            client.submit({"gpus": 1, "command": ["true"], "time_limit_s": 0})
        assert bad.value.status == 422 and bad.value.reasons[0].startswith("time_limit_s 0 is outside")
    done = await asyncio.to_thread(cli, local_stack, token, "submit", "--time-limit", "1s", "--wait", "--", "sleep",
                                   "600")
    assert done.returncode == 143 and "JobFailed" in done.stdout, done.stderr  # ended by SIGTERM, as a shell says


async def test_logs_come_through_the_gateway_and_follow_a_running_job(local_stack):
    token = await token_for(local_stack, "user", "inference", "heidi")
    teammate = await token_for(local_stack, "user", "inference", "ivan")
    script = "for i in 1 2 3 4; do echo line $i; sleep 0.5; done; echo done >&2"
    with Client(local_stack.gateway, token) as client:
        job_id = client.submit({"gpus": 1, "command": ["sh", "-c", script]})["job_id"]
        await wait_state(client, job_id, "Running")
        streamed = b"".join(await asyncio.to_thread(lambda: list(client.follow_logs(job_id))))
        assert streamed == b"line 1\nline 2\nline 3\nline 4\ndone\n"
        assert client.job(job_id)["state"] == "Succeeded"  # the follow ended with the job
        text, offset = client.logs(job_id)
        assert text == streamed and offset == len(streamed)
        gang = client.submit({"gpus": 1, "nodes": 2, "command": ["sh", "-c", "echo rank $NODE_RANK"]})["job_id"]
        await wait_until_finished(local_stack.database_url, [gang], timeout_s=60, interval_s=0.2)
        assert client.logs(gang, rank=1)[0] == b"rank 1\n"
        with pytest.raises(ApiError) as no_rank:
            client.logs(gang, rank=2)
        assert no_rank.value.status == 404
    with Client(local_stack.gateway, teammate) as other, pytest.raises(ApiError) as refused:
        other.logs(job_id)
    assert refused.value.status == 403  # logs may hold what a teammate should not see
    tail = await asyncio.to_thread(cli, local_stack, token, "logs", job_id, "--tail", "2")
    assert tail.returncode == 0 and tail.stdout == "line 4\ndone\n", tail.stderr


CHECKPOINTING = ('if [ -n "$GPUSCHED_RESUME_FROM" ]; then echo "resumed from $GPUSCHED_RESUME_FROM"; exit 0; fi; '
                 'trap \'echo "final" > "$GPUSCHED_CHECKPOINT_FILE"; exit 143\' TERM; '
                 'i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo "step-$i" > "$GPUSCHED_CHECKPOINT_FILE"; sleep 0.2; done')


async def test_drain_moves_a_checkpointing_job_to_another_node_where_it_resumes(local_stack):
    from pathlib import Path

    from gpusched.config import read_config

    operator = read_config(Path(local_stack.config_path))["token"]
    user = await token_for(local_stack, "user", "research", "judy")
    with Client(local_stack.gateway, user) as client, Client(local_stack.gateway, operator) as admin:
        job_id = client.submit({"gpus": 2, "command": ["sh", "-c", CHECKPOINTING]})["job_id"]
        first = (await wait_state(client, job_id, "Running"))["node_id"]
        await asyncio.sleep(1.0)  # a checkpoint or two
        assert admin.drain(first, "replace a PSU", grace_s=5)["drain"] == "requested"
        done = await wait_state(client, job_id, "Succeeded", timeout_s=90)
        assert done["node_id"] != first
        types = [e["type"] for e in done["events"]]
        assert "JobPreempted" in types and types.count("JobPlaced") == 2
        asked = next(e for e in done["events"] if e["type"] == "PreemptionRequested")
        assert asked["payload"]["reason"] == f"node {first} is being drained: replace a PSU"
        assert (await asyncio.to_thread(client.logs, job_id))[0].startswith(b"resumed from ")
        node = next(n for n in admin.nodes()["nodes"] if n["node_id"] == first)
        assert node["state"] == "Drained"
        assert admin.drain(first)["drain"] == "drained already"
        admin.uncordon(first)
        assert next(n for n in admin.nodes()["nodes"] if n["node_id"] == first)["state"] in ("Ready", "Drained")


async def test_a_job_cancelled_while_its_agent_is_down_is_stopped_when_the_agent_returns(local_stack):
    import os
    import signal

    from gpusched_cli import stack
    from gpusched_cli.teardown import agents_dir, job_records
    from gpusched_common.job_records import alive
    from tests.e2e.test_preemption import wait_for_event

    token = await token_for(local_stack, "user", "platform", "erin")
    with Client(local_stack.gateway, token) as client:
        job_id = client.submit({"gpus": 2, "command": ["sleep", "600"]})["job_id"]
        node = (await wait_state(client, job_id, "Running"))["node_id"]
        record = next(r for r in job_records(agents_dir(local_stack.home, local_stack.env), lambda line: None)
                      if r.job_id == job_id)
        agent = f"agent-{node}"
        os.kill(local_stack.processes[agent], signal.SIGKILL)  # the job goes on, its agent gone
        try:
            assert client.cancel(job_id, "agent is down")["cancel"] == "requested"
            await wait_for_event(local_stack.database_url, "JobCancelRequested", [job_id])
            # nobody has seen the process go: the job still holds its GPUs, and it still runs
            assert (client.job(job_id))["state"] == "Running" and await allocations(local_stack, job_id) == 2
            assert alive(record.pid, record.proc_start_ticks)
        finally:
            stack.start_service(local_stack, agent, "services.node_agent",
                                {"GPUSCHED_NODE_ID": node, "GPUSCHED_SIMULATED_GPUS": f"H100-80GB:{STACK_GPUS_PER_NODE}"})
            stack.save(local_stack)
        ended = await wait_state(client, job_id, "Cancelled", timeout_s=90)
        assert [e["type"] for e in ended["events"]].count("JobCancelled") == 1
        assert ended["events"][-1]["type"] in ("JobCancelled", "QuotaReleased")
        assert await allocations(local_stack, job_id) == 0
        assert not alive(record.pid, record.proc_start_ticks)

