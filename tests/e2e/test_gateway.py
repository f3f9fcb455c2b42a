"""The front door end to end, on the local stack (the gateway a real process beside every service, a real
broker, real PostgreSQL): a job submitted with POST /v1/jobs runs to Succeeded in one trace from the
gateway's span to the node agent; following its events delivers every one in order and ends with it; a
retry with the same Idempotency-Key makes no second job; a batch; and the CLI with nothing but
GPUSCHED_SERVER and GPUSCHED_TOKEN in its environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpusched import ApiError, Client
from gpusched.config import read_config
from gpusched_cli.workload import wait_until_finished
from gpusched_common import tokens
from gpusched_common.db import connect
from tests.e2e.conftest import read_spans

ROOT = Path(__file__).resolve().parents[2]


def operator(local_stack) -> Client:
    return Client(local_stack.gateway, read_config(Path(local_stack.config_path))["token"])


async def user_token(local_stack, tenant: str) -> str:
    conn = await connect(local_stack.database_url)
    try:
        text, _ = await tokens.issue(conn, role="user", tenant=tenant, name=f"{tenant}-user", expires_at=None,
                                     created_by="test", now=datetime.now(UTC))
    finally:
        await conn.close()
    return text


async def test_a_job_posted_to_the_gateway_succeeds_in_one_trace_and_its_events_follow_in_order(local_stack):
    token = await user_token(local_stack, "research")
    followed: list[dict] = []
    with Client(local_stack.gateway, token) as client:
        job = client.submit({"gpus": 1, "command": ["sh", "-c", "sleep 1"], "name": "via-gateway"})
        assert (job["tenant"], job["state"], job["replayed"]) == ("research", "Submitted", False)
        # follow from the start, in a thread, while the job runs
        follower = threading.Thread(target=lambda: followed.extend(client.events(job["job_id"], follow=True)))
        follower.start()
        await wait_until_finished(local_stack.database_url, [job["job_id"]], timeout_s=60, interval_s=0.2)
        await asyncio.to_thread(follower.join, 30)
        assert not follower.is_alive(), "the follow did not end with the job"
        view = client.job(job["job_id"])
    assert view["state"] == "Succeeded" and view["name"] == "via-gateway"
    assert view["submitted_by"].startswith("token:") and view["submitted_by"].endswith(":research-user")
    # every event up to the job's end, in order, once: what the store holds, less what follows the end
    ended = [e["version"] for e in view["events"]].index(followed[-1]["version"])
    assert [e["version"] for e in followed] == [e["version"] for e in view["events"][:ended + 1]]
    assert [e["type"] for e in followed] == ["JobSubmitted", "JobAdmitted", "QuotaReserved", "JobPlaced",
                                             "JobStarted", "JobSucceeded"]
    assert view["events"][0]["payload"]["producer"] is not None  # signed by the gateway's producer

    await asyncio.sleep(0.5)  # the agent's last span ends after its report
    spans = read_spans(local_stack.home)
    [gateway_span] = [s for s in spans if s["service"] == "gateway"
                      and s["attributes"].get("gpusched.job_id") == job["job_id"]]
    services = {s["service"] for s in spans if s["trace_id"] == gateway_span["trace_id"]}
    assert {"gateway", "admission", "quota", "placement"} <= services, services
    assert any(s.startswith("node-agent-") for s in services), services


async def test_a_retry_with_the_same_idempotency_key_makes_no_second_job(local_stack):
    with operator(local_stack) as client:
        first = client.submit({"tenant": "inference", "gpus": 1, "command": ["true"]}, idempotency_key="nightly-1")
        await wait_until_finished(local_stack.database_url, [first["job_id"]], timeout_s=60, interval_s=0.2)
        again = client.submit({"tenant": "inference", "gpus": 1, "command": ["true"]}, idempotency_key="nightly-1")
        assert again["job_id"] == first["job_id"] and again["replayed"] and again["state"] == "Succeeded"
        named = client.jobs(tenant="inference")["jobs"]
    assert [j["job_id"] for j in named].count(first["job_id"]) == 1


async def test_a_batch_is_judged_job_by_job_and_the_valid_ones_run(local_stack):
    token = await user_token(local_stack, "platform")
    specs = [{"gpus": 1, "command": ["true"], "name": f"b-{i}"} for i in range(20)]
    specs.insert(5, {"gpus": 99, "command": ["true"]})  # beyond any node
    specs.insert(9, {"tenant": "research", "gpus": 1, "command": ["true"]})  # another tenant's
    with Client(local_stack.gateway, token) as client:
        outcome = client.submit_batch(specs)
        assert (outcome["accepted"], outcome["refused"]) == (20, 2)
        assert outcome["results"][5]["status"] == 422 and "gpus 99 exceeds" in outcome["results"][5]["reasons"][0]
        assert outcome["results"][9]["status"] == 403
        ids = [r["job_id"] for r in outcome["results"] if "job_id" in r]
        await wait_until_finished(local_stack.database_url, ids, timeout_s=90, interval_s=0.3)
        states = {j["job_id"]: j["state"] for j in client.jobs(tenant="platform", limit=100)["jobs"]}
    assert {states[i] for i in ids} == {"Succeeded"}


async def test_refusals_are_problems_with_every_reason_and_other_tenants_jobs_are_not_found(local_stack):
    token = await user_token(local_stack, "ml-eval")
    with Client(local_stack.gateway, token) as client:
        with pytest.raises(ApiError) as bad:
            client.submit({"gpus": 0, "priority": 10_000, "command": []})
        assert bad.value.status == 422 and len(bad.value.reasons) == 3, bad.value.problem
        with pytest.raises(ApiError) as other:
            client.submit({"tenant": "research", "gpus": 1, "command": ["true"]})
        assert other.value.status == 403
        with pytest.raises(ApiError) as unknown:
            client.submit({"gpus": 1, "gpu_model": "nope", "command": ["true"]})
        assert unknown.value.reasons == ["unknown GPU model 'nope': it is no GPU model name (e.g. H100-80GB, "
                                         "NVIDIA A100-SXM4-80GB, NVIDIA-L40S)"]
    with operator(local_stack) as admin:
        research_job = admin.submit({"tenant": "research", "gpus": 1, "command": ["true"]})["job_id"]
    with Client(local_stack.gateway, token) as client, pytest.raises(ApiError) as hidden:
        client.job(research_job)
    assert hidden.value.status == 404


def cli(local_stack, token: str, *args: str) -> subprocess.CompletedProcess:
    """``gpusched`` with only the server and a token: no database URL, no broker address, no config file."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"), "GPUSCHED_SERVER": local_stack.gateway,
           "GPUSCHED_TOKEN": token, "GPUSCHED_CONFIG": "/nonexistent/config.yaml",
           "GPUSCHED_HOME": "/nonexistent/home"}
    return subprocess.run([sys.executable, "-m", "gpusched_cli.main", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


async def test_the_cli_works_with_only_a_server_and_a_token(local_stack):
    token = await user_token(local_stack, "research")
    submitted = await asyncio.to_thread(cli, local_stack, token, "submit", "--name", "cli-job", "--json", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]
    followed = await asyncio.to_thread(cli, local_stack, token, "job", job_id, "--follow")
    assert followed.returncode == 0 and "JobSucceeded" in followed.stdout, followed.stderr
    listed = await asyncio.to_thread(cli, local_stack, token, "jobs", "--name", "cli-job", "--json")
    assert [j["job_id"] for j in json.loads(listed.stdout)] == [job_id]
    for args in (("queue",), ("tenants", "show"), ("job", job_id)):
        done = await asyncio.to_thread(cli, local_stack, token, *args)
        assert done.returncode == 0, (args, done.stderr)
    nodes = await asyncio.to_thread(cli, local_stack, token, "nodes")
    assert nodes.returncode == 1 and "role user may not read nodes" in nodes.stderr  # a clear refusal
    refused = await asyncio.to_thread(cli, local_stack, token, "submit", "--gpus", "0", "--", "true")
    assert refused.returncode == 2 and "gpus must be at least 1" in refused.stderr
    bad = await asyncio.to_thread(cli, local_stack, "gst_0123456789abcdef_" + "x" * 43, "jobs")
    assert bad.returncode == 1 and "API token refused" in bad.stderr and "Traceback" not in bad.stderr


# a pod written for Kubernetes GPU nodes: GPU feature discovery's product label (NVIDIA's spelling for an
# A100 80GB, which no model name of ours spells so) and gpu.present, which gpusched's agents label too
KUBERNETES_POD = """apiVersion: v1
kind: Pod
metadata: {name: k8s-pod, namespace: research}
spec:
  nodeSelector:
    nvidia.com/gpu.product: NVIDIA-A100-80GB-HBM2e
    nvidia.com/gpu.present: "true"
  priorityClassName: high
  activeDeadlineSeconds: 600
  containers:
  - name: main
    command: ["sh", "-c"]
    args: ['test "$(echo "$CUDA_VISIBLE_DEVICES" | tr , " " | wc -w)" = 2 && echo ran']
    resources:
      limits: {nvidia.com/gpu: 2, cpu: "1.5", memory: 129e6}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
"""


async def test_a_kubernetes_pod_file_runs_on_the_node_its_labels_select(local_stack, tmp_path):
    token = await user_token(local_stack, "research")
    path = tmp_path / "pod.yaml"
    path.write_text(KUBERNETES_POD)
    dry = await asyncio.to_thread(cli, local_stack, token, "submit", "-f", str(path), "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert "spec.tolerations" in dry.stdout  # warned, not dropped in silence
    submitted = await asyncio.to_thread(cli, local_stack, token, "submit", "-f", str(path), "--json")
    assert submitted.returncode == 0, submitted.stderr
    answer = json.loads(submitted.stdout)
    job_id = (answer[0] if isinstance(answer, list) else answer)["job_id"]
    with Client(local_stack.gateway, token) as client:
        deadline = asyncio.get_running_loop().time() + 90
        while (job := client.job(job_id))["state"] not in ("Succeeded", "Failed", "Cancelled", "Rejected"):
            assert asyncio.get_running_loop().time() < deadline, job
            await asyncio.sleep(0.2)
    assert job["state"] == "Succeeded", job
    placed = next(e for e in job["events"] if e["type"] == "JobPlaced")["payload"]
    assert placed["gpu_model"] == "A100-80GB", placed
    admitted = next(e for e in job["events"] if e["type"] == "JobAdmitted")["payload"]["spec"]
    assert admitted["priority"] == 50 and admitted["time_limit_s"] == 600 and admitted["cpu_milli"] == 1500
