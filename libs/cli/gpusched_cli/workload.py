"""Submitting a batch of jobs and watching it finish (shared by `demo`, `bench-e2e` and the tests)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg

from gpusched_common import events as ev
from gpusched_common.settings import Settings

from gpusched import Client as GatewayClient
from gpusched.config import read_config
from gpusched_cli.client import Client
from gpusched_cli.stack import StackState

TERMINAL = ("Succeeded", "Failed", "Rejected", "Cancelled")


def demo_workload(jobs: int, tenants: list[str], gpu_models: list[str], seed: int = 7) -> list[ev.JobSpec]:
    """Mixed GPU counts and models, short sleeps, and a few jobs that fail on purpose."""
    rng = random.Random(seed)
    specs = []
    for i in range(jobs):
        gpus = rng.choices([1, 2, 4, 8], weights=[50, 25, 15, 10])[0]
        model = rng.choice([*gpu_models, None])
        seconds = round(rng.uniform(0.2, 2.0), 2)
        command = ["sh", "-c", f"sleep {seconds}; exit 3"] if i % 25 == 24 else ["sleep", str(seconds)]
        specs.append(ev.JobSpec(tenant=tenants[i % len(tenants)], gpus=gpus, gpu_model=model,
                                priority=rng.choice([0, 0, 0, 10, 50]), command=command, name=f"demo-{i}"))
    return specs


async def submit_all(settings: Settings, specs: list[ev.JobSpec], *, rate_per_s: float | None = None) -> list[str]:
    ids = []
    async with Client(settings) as client:
        started = time.monotonic()
        for i, spec in enumerate(specs):
            ids.append(await client.submit(spec))
            if rate_per_s:
                delay = started + (i + 1) / rate_per_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
    return ids


def submit_through_gateway(state: StackState, specs: list[ev.JobSpec], batch: int = 500) -> list[str]:
    """Submit through the stack's gateway (``POST /v1/jobs:batch``) with the operator token `up` wrote;
    every job must be accepted (a refusal raises with its reasons)."""
    token = read_config(Path(state.config_path)).get("token") if state.config_path else None
    assert state.gateway is not None, "the stack has no gateway"
    ids: list[str] = []
    with GatewayClient(state.gateway, token) as client:
        for start in range(0, len(specs), batch):
            outcome = client.submit_batch([s.model_dump(exclude_defaults=True) | {"tenant": s.tenant}
                                           for s in specs[start:start + batch]])
            refused = [r for r in outcome["results"] if "job_id" not in r]
            if refused:
                raise RuntimeError(f"the gateway refused {len(refused)} job(s): {refused[0]}")
            ids.extend(r["job_id"] for r in outcome["results"])
    return ids


async def wait_until_finished(database_url: str, job_ids: list[str], *, timeout_s: float,
                              progress: Callable[[float, dict[str, int]], None] | None = None,
                              interval_s: float = 1.0) -> dict[str, int]:
    """Poll the read model until every job is terminal; returns counts by state."""
    conn = await asyncpg.connect(database_url)
    started = time.monotonic()
    try:
        while True:
            rows = await conn.fetch("SELECT status, count(*) AS n FROM jobs WHERE job_id = ANY($1::text[])"
                                    " GROUP BY status", job_ids)
            counts = {r["status"]: r["n"] for r in rows}
            seen = sum(counts.values())
            if seen < len(job_ids):
                counts["Submitted"] = len(job_ids) - seen
            elapsed = time.monotonic() - started
            if progress:
                progress(elapsed, counts)
            if sum(counts.get(s, 0) for s in TERMINAL) == len(job_ids):
                return counts
            if elapsed > timeout_s:
                raise TimeoutError(f"jobs not finished after {timeout_s}s: {counts}")
            await asyncio.sleep(interval_s)
    finally:
        await conn.close()


def progress_line(total: int) -> Callable[[float, dict[str, int]], None]:
    def show(elapsed: float, counts: dict[str, int]) -> None:
        done = sum(counts.get(s, 0) for s in TERMINAL)
        detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        print(f"  [{elapsed:5.1f}s] {done}/{total} finished  ({detail})", flush=True)

    return show
