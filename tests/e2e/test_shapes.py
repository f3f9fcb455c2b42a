"""End to end on the local stack: gangs, GPU shares and MIG slices are placed, run and end as users expect, and a
cancelled share or slice gives back exactly its part of the GPU."""

from __future__ import annotations

import asyncio
import json

from gpusched_common.db import connect
from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.e2e.test_pipeline import job_view

STACK_NODES = 3
STACK_GPU_MODELS = ["H100-80GB", "H100-80GB", "A100-80GB+mig"]
STACK_GPUS_PER_NODE = 4


def placed(job: dict) -> dict:
    return next(e["payload"] for e in job["events"] if e["type"] == "JobPlaced")


async def held(database_url: str, job_id: str) -> int:
    conn = await connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM gpu_allocations WHERE job_id = $1", job_id)
    finally:
        await conn.close()


async def test_a_gang_runs_on_every_member_node_and_succeeds_when_all_do(local_stack, stack_settings):
    check = 'test "$NNODES" = 2 && test -n "$MASTER_ADDR" && test "$CUDA_VISIBLE_DEVICES" = "0,1,2,3"'
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("g").gpus(4).gang(2).model("H100-80GB").command("sh", "-c", check).spec())
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=90, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    assert job["status"] == "Succeeded", job
    members = placed(job)["members"]
    assert sorted(m["node_id"] for m in members) == ["node-1", "node-2"] and [m["rank"] for m in members] == [0, 1]
    assert [e["type"] for e in job["events"]].count("GangMemberExited") == 1
    assert await held(local_stack.database_url, job_id) == 0


# what torchrun reads when it is given no flags: each argument's PET_<NAME> variable (its env defaults)
TORCHRUN_VIEW = """
import json, os, sys
view = {arg: os.environ.get("PET_" + arg.upper()) for arg in ("nnodes", "node_rank", "nproc_per_node", "master_addr",
                                                             "master_port")}
view.update({name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")})
with open(os.path.join(sys.argv[1], "rank-%s.json" % view["node_rank"]), "w") as out:
    json.dump(view, out)
"""


async def test_a_gang_s_members_agree_on_torchrun_s_rendezvous(local_stack, stack_settings, tmp_path):
    tmp_path.chmod(0o777)
    spec = a_job("t").gpus(2).gang(2).model("H100-80GB").command("python3", "-c", TORCHRUN_VIEW, str(tmp_path)).spec()
    async with Client(stack_settings) as client:
        job_id = await client.submit(spec)
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=90, interval_s=0.2)
    assert (await job_view(local_stack.database_url, job_id))["status"] == "Succeeded"
    views = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert {v["master_addr"] for v in views} == {views[0]["MASTER_ADDR"]} and views[0]["master_addr"]
    assert {v["master_port"] for v in views} == {views[0]["MASTER_PORT"]} and int(views[0]["master_port"]) > 0
    assert [(v["nnodes"], v["node_rank"], v["nproc_per_node"], v["WORLD_SIZE"], v["RANK"]) for v in views] == [
        ("2", "0", "2", "2", "0"), ("2", "1", "2", "2", "1")]


async def test_a_gang_member_that_fails_fails_the_gang_and_stops_the_others(local_stack, stack_settings):
    command = 'if [ "$GPUSCHED_GANG_RANK" = 1 ]; then sleep 1; exit 4; fi; sleep 120'
    async with Client(stack_settings) as client:
        job_id = await client.submit(a_job("g").gpus(2).gang(2).model("H100-80GB").command("sh", "-c", command).spec())
    await wait_until_finished(local_stack.database_url, [job_id], timeout_s=90, interval_s=0.2)
    job = await job_view(local_stack.database_url, job_id)
    assert job["status"] == "Failed" and job["exit_code"] == 4, job
    assert job["reasons"][0].startswith("gang member 1 on node-"), job["reasons"]
    assert await held(local_stack.database_url, job_id) == 0
    async with Client(stack_settings) as client:  # rank 0 was stopped: its GPUs take a new gang at once
        again = await client.submit(a_job("g").gpus(4).gang(2).model("H100-80GB").command("true").spec())
    await wait_until_finished(local_stack.database_url, [again], timeout_s=90, interval_s=0.2)
    assert (await job_view(local_stack.database_url, again))["status"] == "Succeeded"


async def test_shares_of_one_gpu_run_side_by_side_with_their_limits(local_stack, stack_settings):
    check = 'test "$GPUSCHED_GPU_SHARE_MILLI" = 500 && test "$GPUSCHED_GPU_MEMORY_LIMIT_MIB" = 20000 && sleep 2'
    async with Client(stack_settings) as client:
        ids = [await client.submit(a_job("s").share(500, 20_000).model("H100-80GB").command("sh", "-c", check).spec())
               for _ in range(2)]
    await wait_until_finished(local_stack.database_url, ids, timeout_s=90, interval_s=0.2)
    jobs = [await job_view(local_stack.database_url, i) for i in ids]
    assert [j["status"] for j in jobs] == ["Succeeded", "Succeeded"], jobs
    spots = {(placed(j)["node_id"], tuple(placed(j)["gpu_indices"])) for j in jobs}
    assert len(spots) == 1  # best fit packs both halves onto one GPU
    assert all(placed(j)["gpu_share_milli"] == 500 for j in jobs)


async def test_a_mig_slice_runs_on_its_own_mig_device(local_stack, stack_settings):
    check = 'case "$CUDA_VISIBLE_DEVICES" in MIG-*) test "$GPUSCHED_MIG_PROFILE" = 3g.40gb;; *) exit 3;; esac'
    async with Client(stack_settings) as client:
        ids = [await client.submit(a_job("m").mig("3g.40gb").model("A100-80GB").command("sh", "-c", check).spec())
               for _ in range(3)]
    await wait_until_finished(local_stack.database_url, ids, timeout_s=90, interval_s=0.2)
    jobs = [await job_view(local_stack.database_url, i) for i in ids]
    assert [j["status"] for j in jobs] == ["Succeeded"] * 3, jobs
    assert all(placed(j)["node_id"] == "node-3" and placed(j)["mig_start"] in (0, 4) for j in jobs)
    await asyncio.sleep(0)


async def test_cancelling_a_share_and_a_mig_slice_frees_their_part_of_the_gpu(local_stack):
    from gpusched import Client as GatewayClient
    from tests.e2e.test_job_control import token_for, wait_state

    token = await token_for(local_stack, "user", "research", "shape-canceller")
    with GatewayClient(local_stack.gateway, token) as client:
        share = client.submit({"gpus": 1, "gpu_share": {"milli": 500, "memory_mib": 20_000}, "gpu_model": "H100-80GB",
                               "command": ["sleep", "600"]})["job_id"]
        mig = client.submit({"gpus": 1, "mig_profile": "3g.40gb", "gpu_model": "A100-80GB",
                             "command": ["sleep", "600"]})["job_id"]
        for job_id in (share, mig):
            await wait_state(client, job_id, "Running")
            assert await held(local_stack.database_url, job_id) == 1
            assert client.cancel(job_id)["cancel"] == "requested"
        for job_id in (share, mig):
            ended = await wait_state(client, job_id, "Cancelled")
            assert [e["type"] for e in ended["events"]].count("JobCancelled") == 1
            assert await held(local_stack.database_url, job_id) == 0
        # the slice's place takes a new slice at once
        again = client.submit({"gpus": 1, "mig_profile": "3g.40gb", "gpu_model": "A100-80GB",
                               "command": ["true"]})["job_id"]
        assert (await wait_state(client, again, "Succeeded"))["node_id"] == "node-3"
