"""`gpusched whatif` on a history the local stack made: twenty short jobs of a few shapes from two tenants run
to their end, then the CLI (a subprocess with only GPUSCHED_SERVER and GPUSCHED_TOKEN) replays them under two
placement policies, and under a tenancy that gives one tenant no quota."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gpusched import Client
from gpusched.config import read_config
from gpusched_cli.workload import wait_until_finished
from tests.e2e.test_gateway import cli

NO_QUOTA_FOR_RESEARCH = """
version: 1
revision: 1
flavors: [H100-80GB, A100-80GB]
tenants:
  - name: cluster
    children:
      - name: research
        quota: {H100-80GB: {nominal: 0, borrowing_limit: 0}, A100-80GB: {nominal: 0, borrowing_limit: 0}}
      - name: inference
        quota: {H100-80GB: {nominal: 8}, A100-80GB: {nominal: 8}}
"""


async def test_whatif_replays_every_job_of_the_stack_s_history(local_stack, tmp_path: Path):
    token = read_config(Path(local_stack.config_path))["token"]
    with Client(local_stack.gateway, token) as client:
        jobs = [client.submit({"tenant": tenant, "gpus": gpus, "command": ["sh", "-c", "sleep 1"]})["job_id"]
                for i in range(10) for tenant, gpus in (("research", (1, 2, 4)[i % 3]), ("inference", (1, 4)[i % 2]))]
    await wait_until_finished(local_stack.database_url, jobs, timeout_s=180, interval_s=0.5)

    done = await asyncio.to_thread(cli, local_stack, token, "whatif", "--since", "1h", "--policy", "bestfit,ours",
                                   "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["jobs"] == len(jobs) and report["gpus"] == 16 and set(report["runs"]) == {"bestfit", "ours"}
    for run in report["runs"].values():
        assert run["replayed"] == len(jobs) and not run["unschedulable"]
        assert set(run["tenants"]) == {"research", "inference"}
        assert all(t["jobs"] == 10 and t["avg_wait_s"] >= 0 and t["p99_wait_s"] >= 0 for t in run["tenants"].values())
        assert 0 < run["gpu_allocation_pct"] <= 100 and run["avg_jct_s"] >= 1

    tenancy = tmp_path / "no-research.yaml"
    tenancy.write_text(NO_QUOTA_FOR_RESEARCH)
    starved = await asyncio.to_thread(cli, local_stack, token, "whatif", "--since", "1h", "--policy", "bestfit",
                                      "--tenancy", str(tenancy), "--json")
    assert starved.returncode == 0, starved.stderr
    [run] = json.loads(starved.stdout)["runs"].values()
    research, inference = run["tenants"]["research"], run["tenants"]["inference"]
    assert research["unschedulable"] == 10 and research["replayed"] == 0
    assert inference["replayed"] == 10 and run["max_quota_overshoot_gpus"] == 0
