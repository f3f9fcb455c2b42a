"""`gpusched bench-e2e` (`make bench-e2e`): jobs through the running local stack, beside a same-run floor.

The floor is what the pipeline can never beat on this machine: single-row PostgreSQL commits per second
and a broker produce -> consume round trip. Results print as a table and go to bench-results/e2e.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from gpusched_common import events as ev

from gpusched_cli import stack
from gpusched_common.table import render
from gpusched_cli.workload import progress_line, submit_all, wait_until_finished


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default="bench-results/e2e.json")


def cmd_bench(args: argparse.Namespace) -> int:
    state = stack.load()
    if state is None:
        print("gpusched bench-e2e: no local stack is up; run `gpusched up` first (or `make bench-e2e`)")
        return 1
    return asyncio.run(run_bench(args, state))


async def floor_pg_commits_per_s(database_url: str, n: int = 500) -> float:
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("CREATE TEMP TABLE bench_floor (id int PRIMARY KEY, at timestamptz)")
        started = time.perf_counter()
        for i in range(n):
            await conn.execute("INSERT INTO bench_floor VALUES ($1, now())", i)  # autocommit: one commit each
        return n / (time.perf_counter() - started)
    finally:
        await conn.close()


async def floor_topic(bootstrap: str, name: str) -> str:
    """A fresh topic of one partition for a floor measurement (Apache Kafka creates none on first use)."""
    topic = f"gpusched.bench.{name}.{int(time.time() * 1000)}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    return topic


async def floor_broker_rtt_ms(bootstrap: str, n: int = 200) -> float:
    topic = await floor_topic(bootstrap, "floor")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=0)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_wait_ms=5)
    await producer.start()
    await producer.send_and_wait(topic, b"warmup")
    await consumer.start()
    try:
        await consumer.getone()
        rtts = []
        for i in range(n):
            started = time.perf_counter()
            await producer.send_and_wait(topic, str(i).encode())
            await consumer.getone()
            rtts.append((time.perf_counter() - started) * 1000)
        return statistics.median(rtts)
    finally:
        await consumer.stop()
        await producer.stop()


async def run_bench(args: argparse.Namespace, state: stack.StackState) -> dict:
    settings = stack.client_settings(state)
    print("measuring the floor (PostgreSQL single-row commits, broker round trip) ...")
    pg_rate = await floor_pg_commits_per_s(state.database_url)
    rtt = await floor_broker_rtt_ms(state.kafka_bootstrap)
    specs = [ev.JobSpec(tenant=f"bench-{i % args.tenants}", gpus=1, command=["true"], name=f"bench-{i}")
             for i in range(args.jobs)]
    print(f"submitting {args.jobs} one-GPU jobs ...")
    started = time.monotonic()
    ids = await submit_all(settings, specs)
    await wait_until_finished(state.database_url, ids, timeout_s=args.timeout, progress=progress_line(len(ids)),
                              interval_s=2.0)
    conn = await asyncpg.connect(state.database_url)
    try:
        row = await conn.fetchrow(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99 FROM ("
            " SELECT extract(epoch FROM placed_at - submitted_at) * 1000 AS ms FROM jobs"
            " WHERE job_id = ANY($1::text[]) AND placed_at IS NOT NULL) t", ids)
        span = await conn.fetchval(
            "SELECT extract(epoch FROM max(finished_at) - min(submitted_at)) FROM jobs WHERE job_id = ANY($1::text[])",
            ids)
    finally:
        await conn.close()
    wall = time.monotonic() - started
    result = {
        "jobs": args.jobs,
        "jobs_per_s": round(args.jobs / float(span or wall), 1),
        "submit_to_placed_p50_ms": round(row["p50"], 1),
        "submit_to_placed_p99_ms": round(row["p99"], 1),
        "floor_pg_commits_per_s": round(pg_rate, 1),
        "floor_broker_rtt_ms": round(rtt, 2),
    }
    result["ratio_jobs_per_s_to_pg_commits_per_s"] = round(result["jobs_per_s"] / result["floor_pg_commits_per_s"], 4)
    result["ratio_p50_to_broker_rtt"] = round(result["submit_to_placed_p50_ms"] / result["floor_broker_rtt_ms"], 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print()
    print(render(["METRIC", "VALUE"], list(result.items())))
    print(f"\nwritten to {out}")
    return 0
