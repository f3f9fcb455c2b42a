"""The pre-submission check on the local stack (the gateway a real process as its own database role, every
service, a real broker and PostgreSQL): on an empty cluster a check answers ``start`` with a node, and the
same job, then submitted, starts there; a job of 16 GPUs can never run here (the CLI exits 2)."""

from __future__ import annotations

import asyncio
import json

from gpusched import Client
from gpusched_cli.workload import wait_until_finished
from tests.e2e.test_gateway import cli, user_token

JOB = {"gpus": 2, "gpu_model": "H100-80GB", "command": ["sh", "-c", "sleep 1"], "name": "checked"}


async def test_a_check_says_start_on_a_node_and_the_job_submitted_then_starts_there(local_stack):
    token = await user_token(local_stack, "research")
    with Client(local_stack.gateway, token) as client:
        answer = client.check(JOB)
        assert answer["verdict"] == "start", answer
        node = answer["placement"]["node_id"]
        assert answer["summary"].startswith(f"would start now on {node} GPUs ")
        assert client.jobs()["jobs"] == []  # the check submitted nothing
        job = client.submit(JOB)
        await wait_until_finished(local_stack.database_url, [job["job_id"]], timeout_s=60, interval_s=0.2)
        view = client.job(job["job_id"])
    assert view["state"] == "Succeeded" and view["node_id"] == node, view


async def test_a_check_of_16_gpus_says_never_and_the_cli_exits_2(local_stack):
    token = await user_token(local_stack, "research")
    checked = await asyncio.to_thread(cli, local_stack, token, "submit", "--check", "--json", "--gpus", "16",
                                      "--", "true")
    assert checked.returncode == 2, (checked.stdout, checked.stderr)
    answer = json.loads(checked.stdout)
    assert answer["verdict"] == "never" and answer["summary"].startswith("can never run here: gpus 16 exceeds")
