"""Job arrays and dependencies through the gateway, end to end on the local stack: an array of 20 runs each
task once with its own index and never more than its cap at once (the cap is the reason a task waits);
`gpusched jobs --array` lists it and `gpusched cancel ARRAY` ends every task; a dependency chain runs in
order, each waiting job saying for whom; a failed dependency ends its dependants (and theirs) Cancelled
with the reason, while one that waits for any end runs; an unknown dependency is refused."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path

import pytest

from gpusched import ApiError, Client
from gpusched_cli.workload import wait_until_finished
from tests.e2e.test_gateway import cli
from tests.e2e.test_job_control import first_running, token_for, wait_state

STACK_NODES = 2
STACK_GPU_MODELS = ["H100-80GB"]
STACK_GPUS_PER_NODE = 4


def _intervals(directory: Path) -> dict[int, tuple[float, float]]:
    out = {}
    for start in directory.glob("*.start"):
        index = int(start.stem)
        out[index] = (float(start.read_text()), float((directory / f"{index}.end").read_text()))
    return out


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


async def test_an_array_runs_every_index_once_within_its_cap(local_stack, tmp_path):
    token = await token_for(local_stack, "user", "research", "array-user")
    record = ('python3 -c "import time; print(time.time())" > "$OUT/$GPUSCHED_ARRAY_INDEX.start"; '
              'test "$GPUSCHED_ARRAY_JOB_ID.$GPUSCHED_ARRAY_INDEX" = "$GPUSCHED_JOB_ID" || exit 3; sleep 1; '
              'python3 -c "import time; print(time.time())" > "$OUT/$GPUSCHED_ARRAY_INDEX.end"')
    with Client(local_stack.gateway, token) as client:
        submitted = client.submit({"gpus": 1, "command": ["sh", "-c", record], "env": {"OUT": str(tmp_path)},
                                   "name": "sweep"}, array="0-19%3")
        array_id = submitted["array_id"]
        assert (submitted["tasks"], submitted["indices"], submitted["state"]) == (20, "0-19%3", "Submitted")
        tasks = [f"{array_id}.{i}" for i in range(20)]
        await wait_until_finished(local_stack.database_url, tasks, timeout_s=240, interval_s=0.5)
        listed = await asyncio.to_thread(cli, local_stack, token, "jobs", "--array", array_id, "--json")
        assert listed.returncode == 0, listed.stderr
        jobs = json.loads(listed.stdout)
        assert [j["job_id"] for j in jobs] == tasks and {j["state"] for j in jobs} == {"Succeeded"}
        # the tasks reach quota on different partitions, so any of them may be among the first three; the
        # others wait for the cap, and say so
        cap = f"array {array_id} runs at most 3 tasks at once"
        capped = [t for t in tasks if any(e["type"] == "QuotaDeferred" and e["payload"]["reason"] == cap
                                          for e in client.job(t)["events"])]
        assert capped, "no task said it waited for the array's cap"
    intervals = _intervals(tmp_path)
    assert sorted(intervals) == list(range(20))  # every index ran, once each (a file per index)
    assert _most_at_once(list(intervals.values())) <= 3


async def test_cancelling_an_array_ends_every_task(local_stack):
    token = await token_for(local_stack, "user", "inference", "array-canceller")
    outsider = await token_for(local_stack, "user", "platform", "array-outsider")
    with Client(local_stack.gateway, token) as client:
        array_id = client.submit({"gpus": 1, "command": ["sleep", "600"]}, array="0-5%2")["array_id"]
        # the tasks reach admission on different partitions, so any two may be the first to run
        await first_running(client, [f"{array_id}.{i}" for i in range(6)])
        with Client(local_stack.gateway, outsider) as other, pytest.raises(ApiError) as hidden:
            other.cancel(array_id)
        assert hidden.value.status == 404
        done = await asyncio.to_thread(cli, local_stack, token, "cancel", array_id, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)[0]["requested"] == 6
        for index in range(6):
            await wait_state(client, f"{array_id}.{index}", "Cancelled")


async def test_a_dependency_chain_runs_in_order_and_a_failure_ends_its_dependants(local_stack, tmp_path):
    token = await token_for(local_stack, "user", "ml-eval", "chain-user")
    go = tmp_path / "go"  # the first job runs until the test has seen its dependant wait
    with Client(local_stack.gateway, token) as client:
        first = client.submit({"gpus": 1, "command": ["sh", "-c", 'while [ ! -f "$GO" ]; do sleep 0.1; done'],
                               "env": {"GO": str(go)}})["job_id"]
        second = client.submit({"gpus": 1, "command": ["true"], "after": [{"job_id": first}]})["job_id"]
        third = (await asyncio.to_thread(cli, local_stack, token, "submit", "--after", f"{second}:any", "--json",
                                         "--", "true"))
        assert third.returncode == 0, third.stderr
        third_id = json.loads(third.stdout)["job_id"]
        waiting = await wait_state(client, second, "Admitted")
        assert waiting["reasons"][-1] == f"waiting for {first} to succeed"
        go.touch()
        await wait_until_finished(local_stack.database_url, [first, second, third_id], timeout_s=120, interval_s=0.3)
        jobs = [client.job(j) for j in (first, second, third_id)]
        assert [j["state"] for j in jobs] == ["Succeeded"] * 3
        ended = [datetime.fromisoformat(j["finished_at"]) for j in jobs]
        started = [datetime.fromisoformat(next(e["occurred_at"] for e in j["events"] if e["type"] == "JobStarted"))
                   for j in jobs]
        assert started[1] >= ended[0] and started[2] >= ended[1]

        failing = client.submit({"gpus": 1, "command": ["false"]})["job_id"]
        dependant = client.submit({"gpus": 1, "command": ["true"], "after": [{"job_id": failing}]})["job_id"]
        downstream = client.submit({"gpus": 1, "command": ["true"], "after": [{"job_id": dependant}]})["job_id"]
        regardless = client.submit({"gpus": 1, "command": ["true"],
                                    "after": [{"job_id": failing, "condition": "any"}]})["job_id"]
        cancelled = await wait_state(client, dependant, "Cancelled")
        assert cancelled["events"][-1]["payload"]["reason"] == (
            f"dependency {failing} ended Failed, so this job, which waits for it to succeed, can never run")
        assert (await wait_state(client, downstream, "Cancelled"))["events"][-1]["payload"]["reason"].startswith(
            f"dependency {dependant} ended Cancelled")
        assert (await wait_state(client, regardless, "Succeeded"))["state"] == "Succeeded"

        with pytest.raises(ApiError) as unknown:
            client.submit({"gpus": 1, "command": ["true"], "after": [{"job_id": "j-never-submitted"}]})
        assert unknown.value.status == 422 and "no job j-never-submitted to wait for" in unknown.value.reasons
