"""`gpusched bench-scale` (`make bench-scale`): scheduling measured the way schedulers are judged (issue 16).

A local stack of its own with ``--nodes`` simulated nodes (fleets of agents, every node with its own key,
lease, heartbeats and telemetry) and every service as its own process. Two phases, each on a fresh stack:

1. **Burst**: ``--jobs`` jobs of mixed shapes (mostly 1-8 GPUs, some GPU shares and 2 x 8 gangs) that
   run an hour, submitted at once through the gateway's batch route. A job counts as placed when its node
   agent reported it started (admission, quota, placement and the agent, each durable). ``placed_per_s``
   is the placed jobs over the time from the first submission to the last start; the cluster fills before
   every job has room, the rest wait (and show what a waiting job costs each service in memory). Per stage
   (admitted, reserved, placed, StartJob published, started): when 10, 50, 90 and 100% of the jobs had got
   there, and the stage's pace between 10 and 90%: the slowest stage holds the burst (``burst_stages``).
2. **Half load**: jobs submitted at a steady half of the burst's rate for ``--half-load-s`` seconds (at most
   a third of the cluster's GPUs in all), and their submit -> placed latencies.

Beside them, the floors of the same run: PostgreSQL appending event rows in batched transactions, and the
broker carrying messages produced and consumed in batches. Per service: CPU milliseconds per placed job, net
of what the idle cluster costs (heartbeats, telemetry, measured for ``--idle-s`` before the burst), the
cores it used idle and during the burst, resident memory, and memory per waiting job. And the whole machine's
busy cores idle and in the burst (every process, the jobs' own shells and the kernel too), its CPU per placed
job net of idle, and the rate that cost would allow beside the idle load (``machine_bound_placed_per_s``): a
burst that keeps every core busy is bound by CPU, not by a wait; and, measured first on the quiet machine,
what starting one job's processes costs it (``start_floor``): the most jobs a second the machine could start
with simulated nodes on it, whatever the scheduler costs. A table, and ``bench-results/scale.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from gpusched_common import events as ev
from gpusched_common.infra.brokers import BROKER_KINDS
from gpusched_common.table import render

from gpusched_cli import stack
from gpusched_cli.hops import burst_stages, hop_rows, job_hops, relay_delays
from gpusched_cli.bench import floor_topic
from gpusched_cli.proc_usage import busy_cores, machine_cpu_s, postmaster_pid, usage as proc_usage
from gpusched_cli.start_floor import floor_job_start_ms
from gpusched_cli.workload import submit_through_gateway

TENANTS = ("research", "inference", "platform", "ml-eval")
RUN = ["sleep", "3600"]


def add_scale_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=1000, help="simulated nodes of 8 GPUs (default 1,000)")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs in the burst (default 20,000)")
    p.add_argument("--fleet-processes", type=int, default=0, help="agent processes (default: one per 250 nodes)")
    p.add_argument("--half-load-s", type=float, default=20.0, help="seconds of the half-load phase (0: skip it)")
    p.add_argument("--settle-s", type=float, default=30.0,
                   help="the burst ends when no job started for this long (the cluster is full or all ran)")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up on a phase after this many seconds")
    add_stack_arguments(p, "bench-results/scale.json")


def add_stack_arguments(p: argparse.ArgumentParser, out: str) -> None:
    """What every benchmark on a simulated fleet of its own takes (bench-scale, bench-growth)."""
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds the idle cluster is measured first")
    p.add_argument("--telemetry-s", type=float, default=15.0,
                   help="each node's telemetry interval (default 15 s, a DCGM exporter's usual scrape; heartbeats "
                        "stay at their 10 s)")
    p.add_argument("--health-s", type=float, default=10.0, help="each simulated node's health check interval")
    p.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--out", default=out)
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def scale_workload(count: int, seed: int, prefix: str = "scale") -> list[ev.JobSpec]:
    """Mixed shapes that run for an hour: 1 GPU 45%, 2 GPUs 15%, 4 GPUs 10%, 8 GPUs 5%, a quarter or half of
    a GPU 20%, gangs of 2 nodes x 8 GPUs 5%; tenants round robin."""
    rng = random.Random(seed)
    shapes: list[dict] = [{"gpus": 1}, {"gpus": 2}, {"gpus": 4}, {"gpus": 8},
                          {"gpus": 1, "gpu_share": ev.GpuShareSpec(milli=250)},
                          {"gpus": 1, "gpu_share": ev.GpuShareSpec(milli=500)}, {"gpus": 8, "nodes": 2}]
    weights = (45, 15, 10, 5, 10, 10, 5)
    return [ev.JobSpec(tenant=TENANTS[i % len(TENANTS)], command=RUN, name=f"{prefix}-{i}",
                       **rng.choices(shapes, weights)[0]) for i in range(count)]


def gpu_demand(spec: ev.JobSpec) -> float:
    return spec.gpu_share.milli / 1000 if spec.gpu_share else spec.gpus * spec.nodes


# --- the floors ----------------------------------------------------------------------------------------


async def floor_pg_batch_events_per_s(database_url: str, batches: int = 40, rows: int = 500) -> float:
    """Event-sized rows (a JSON payload of ~400 bytes) appended ``rows`` to a transaction, one commit each."""
    conn = await asyncpg.connect(database_url)
    payload = json.dumps({"job_id": "j-" + "0" * 16, "spec": {"command": RUN, "gpus": 1, "tenant": "research"},
                          "reasons": ["x" * 200]})
    try:
        await conn.execute("CREATE TEMP TABLE bench_events (position bigserial PRIMARY KEY, stream_id text,"
                           " version int, type text, payload jsonb, at timestamptz DEFAULT now(),"
                           " UNIQUE (stream_id, version))")
        started = time.perf_counter()
        for b in range(batches):
            async with conn.transaction():
                await conn.executemany(
                    "INSERT INTO bench_events (stream_id, version, type, payload) VALUES ($1, 1, 'JobPlaced', $2)",
                    [(f"job-{b}-{i}", payload) for i in range(rows)])
        return batches * rows / (time.perf_counter() - started)
    finally:
        await conn.close()


async def floor_broker_msgs_per_s(bootstrap: str, count: int = 20_000, size: int = 600) -> float:
    """Messages of ``size`` bytes produced (batched, acks=all) and consumed by one consumer, end to end."""
    topic = await floor_topic(bootstrap, "scale")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=5)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_wait_ms=50)
    await producer.start()
    await consumer.start()
    try:
        value = b"x" * size
        started = time.perf_counter()
        sends = [await producer.send(topic, value, key=str(i % 64).encode()) for i in range(count)]
        await asyncio.gather(*sends)
        seen = 0
        while seen < count:
            batch = await consumer.getmany(timeout_ms=1000, max_records=5000)
            seen += sum(len(records) for records in batch.values())
        return count / (time.perf_counter() - started)
    finally:
        await consumer.stop()
        await producer.stop()


# --- watching the stack ------------------------------------------------------------------------------


def stack_pids(state: stack.StackState) -> dict[str, int]:
    """Every process of the stack by name, the broker and PostgreSQL too (``per_service`` sums the fleets)."""
    pids = dict(state.processes)
    broker = state.running_broker
    if broker is not None:
        pids["broker"] = broker.pid
    if state.private_pg:
        pg = postmaster_pid(state.private_pg["data_dir"])
        if pg is not None:
            pids["postgres"] = pg
    return pids


def usage(pids: dict[str, int]) -> dict:
    """CPU and memory of the stack's processes, PostgreSQL with its backends (an agent's watchdog and jobs
    are not counted: listing thousands of jobs every second would cost more than what is measured)."""
    return proc_usage(pids, trees=frozenset({"postgres"}))


def per_service(values: dict[str, float], combine: Callable[[list[float]], float] = sum) -> dict[str, float]:
    """Agents' figures combined into one `agents` entry (fleets of the same stack)."""
    out: dict[str, list[float]] = {}
    for name, value in values.items():
        out.setdefault("agents" if name.startswith("agent-") else name, []).append(value)
    return {name: combine(items) for name, items in out.items()}


def _scope(ids: list[str] | None, tenants: list[str] | None) -> tuple[str, list]:
    """The jobs a count covers: all, those of ``ids``, or those of ``tenants`` (SQL after WHERE/AND, its args)."""
    if ids is not None:
        return "job_id = ANY($1::text[])", [ids]
    if tenants is not None:
        return "tenant = ANY($1::text[])", [tenants]
    return "true", []


async def counts(conn: asyncpg.Connection, ids: list[str] | None = None,
                 tenants: list[str] | None = None) -> tuple[int, int, int]:
    """(submitted, placed, started) jobs of the stack (or of ``ids``, or of ``tenants``)."""
    where, args = _scope(ids, tenants)
    row = await conn.fetchrow(
        "SELECT count(*) AS n, count(placed_at) AS placed, count(started_at) AS started FROM jobs WHERE " + where,
        *args)
    return row["n"], row["placed"], row["started"]


async def latencies(conn: asyncpg.Connection, ids: list[str] | None = None,
                    tenants: list[str] | None = None) -> dict[str, float | None]:
    where, args = _scope(ids, tenants)
    row = await conn.fetchrow(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY placed) AS placed_p50,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY placed) AS placed_p99,"
        " percentile_cont(0.5) WITHIN GROUP (ORDER BY started) AS started_p50,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY started) AS started_p99,"
        " extract(epoch FROM max(started_at) - min(submitted_at)) AS span_s FROM ("
        " SELECT extract(epoch FROM placed_at - submitted_at) * 1000 AS placed,"
        " extract(epoch FROM started_at - submitted_at) * 1000 AS started, started_at, submitted_at"
        " FROM jobs WHERE started_at IS NOT NULL AND " + where + ") t", *args)
    return {k: (round(float(v), 1) if v is not None else None) for k, v in dict(row).items()}


# --- the phases --------------------------------------------------------------------------------------


async def up_for(args: argparse.Namespace, progress: Callable[[str], None],
                 extra_env: dict[str, str] | None = None) -> stack.StackState:
    processes = args.fleet_processes or max(1, -(-args.nodes // 250))
    env = {"GPUSCHED_TELEMETRY_INTERVAL_S": f"{args.telemetry_s:g}", "GPUSCHED_HEALTH_INTERVAL_S": f"{args.health_s:g}",
           **(extra_env or {})}
    return await stack.up(nodes=0, gpu_models=["H100-80GB"], gpus_per_node=8, broker=args.broker,
                          fleet=args.nodes, fleet_processes=processes, database_name="gpusched_scale",
                          extra_env=env, progress=lambda line: progress("  " + line))


async def burst(args: argparse.Namespace, state: stack.StackState, progress: Callable[[str], None]) -> dict:
    """The burst phase; counts and latencies are of the burst's tenants' jobs (``TENANTS``) only."""
    specs = scale_workload(args.jobs, args.seed)
    pids = stack_pids(state)
    conn = await asyncpg.connect(state.database_url)
    try:
        progress(f"  {args.idle_s:g}s of the idle cluster first (heartbeats, telemetry: what the burst's CPU is net of)")
        idle_from, idle_at, machine_idle_from = usage(pids), time.monotonic(), machine_cpu_s()
        await asyncio.sleep(args.idle_s)
        before, machine_before = usage(pids), machine_cpu_s()
        idle_rate = {name: (before[name].cpu_s - idle_from[name].cpu_s) / (time.monotonic() - idle_at) for name in pids}
        started_at = time.monotonic()
        at_change, machine_at_change = before, machine_before
        submitting = asyncio.create_task(asyncio.to_thread(submit_through_gateway, state, specs))
        last_started, last_change = -1, time.monotonic()
        submitted_s = None
        while True:
            await asyncio.sleep(1.0)
            n, placed, started = await counts(conn, tenants=list(TENANTS))
            now = time.monotonic()
            if submitting.done() and submitted_s is None:
                submitting.result()  # a refusal raises here
                submitted_s = now - started_at
            if started != last_started:
                last_started, last_change, at_change, machine_at_change = started, now, usage(pids), machine_cpu_s()
            progress(f"  [{now - started_at:6.1f}s] submitted {n}, placed {placed}, started {started}")
            # settled: all started, or none started for settle_s since the first start (a slow first start
            # is a slow pipeline, not a full cluster; ``timeout`` bounds it)
            if submitted_s is not None and (started >= len(specs) or (started > 0 and now - last_change >= args.settle_s)):
                break
            if now - started_at > args.timeout:
                progress(f"  the burst did not settle within {args.timeout:g}s; measuring what ran")
                break
        after = usage(pids)
        lat = await latencies(conn, tenants=list(TENANTS))
        stages = await burst_stages(conn, submitting.result()) if submitting.done() else {}
        waiting = len(specs) - last_started
    finally:
        await conn.close()
    busy = max(last_change - started_at, 1e-9)  # from the first submission to the last start
    idle = per_service(idle_rate)
    cpu = per_service({name: at_change[name].cpu_s - before[name].cpu_s - idle_rate[name] * busy for name in pids})
    rss = per_service({name: after[name].rss_mib for name in pids}, max)
    rss_before = per_service({name: before[name].rss_mib for name in pids}, max)
    span = lat["span_s"] or (time.monotonic() - started_at)
    cores = os.cpu_count() or 1
    machine_idle = busy_cores(machine_idle_from, machine_before, cores)
    machine_burst = busy_cores(machine_before, machine_at_change, cores)
    machine_net_ms = 1000 * (machine_burst - machine_idle) * busy / max(last_started, 1)
    return {
        "placed": last_started, "waiting": waiting, "submit_s": round(submitted_s or 0.0, 1),
        "placed_per_s": round(last_started / span, 1) if span else 0.0,
        "submit_to_placed_p50_ms": lat["placed_p50"], "submit_to_placed_p99_ms": lat["placed_p99"],
        "submit_to_started_p50_ms": lat["started_p50"], "submit_to_started_p99_ms": lat["started_p99"],
        "cpu_ms_per_job": {k: round(1000 * v / max(last_started, 1), 2) for k, v in sorted(cpu.items())},
        "cpu_ms_per_job_total": round(1000 * sum(cpu.values()) / max(last_started, 1), 2),
        # the whole machine (every process, the jobs' own and the kernel's work too): what bounds the rate
        "machine_cores": cores,
        "machine_busy_cores_idle": round(machine_idle, 2),
        "machine_busy_cores_burst": round(machine_burst, 2),
        "machine_cpu_ms_per_job": round(machine_net_ms, 2),
        # the most jobs/s the machine could place at that cost beside the idle cluster's load
        "machine_bound_placed_per_s": round(1000 * (cores - machine_idle) / machine_net_ms, 1)
        if machine_net_ms > 0 else None,
        "idle_cores": {k: round(v, 3) for k, v in sorted(idle.items())},
        "idle_cores_total": round(sum(idle.values()), 2),
        "burst_cores": {k: round(v / busy, 2) + round(idle[k], 2) for k, v in sorted(cpu.items())},
        "rss_mib": {k: round(v, 1) for k, v in sorted(rss.items())},
        "burst_stages": stages,
        "rss_kib_per_waiting_job": {k: round(1024 * (rss[k] - rss_before.get(k, 0.0)) / waiting, 2)
                                    for k in sorted(rss)} if waiting > 0 else {},
    }


async def half_load(args: argparse.Namespace, state: stack.StackState, rate: float,
                    progress: Callable[[str], None]) -> dict:
    """Jobs at ``rate`` per second for ``args.half_load_s`` seconds (at most a third of the GPUs)."""
    gpus = args.nodes * 8
    specs, demand = [], 0.0
    for spec in scale_workload(int(rate * args.half_load_s) + 1, args.seed + 1, prefix="steady"):
        if demand + gpu_demand(spec) > gpus / 3:
            break
        specs.append(spec)
        demand += gpu_demand(spec)
    progress(f"  {args.idle_s:g}s for the new cluster to settle (registrations, first telemetry) ...")
    await asyncio.sleep(args.idle_s)
    tick = 0.2
    per_tick = max(1, round(rate * tick))
    ids: list[str] = []
    progress(f"  submitting {len(specs)} jobs at {rate:.0f}/s ...")
    started = time.monotonic()
    for i in range(0, len(specs), per_tick):
        ids += await asyncio.to_thread(submit_through_gateway, state, specs[i:i + per_tick])
        delay = started + (i // per_tick + 1) * tick - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    offered = len(ids) / (time.monotonic() - started)
    conn = await asyncpg.connect(state.database_url)
    try:
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            _, placed, started_n = await counts(conn, ids)
            if started_n >= len(ids):
                break
            progress(f"  placed {placed}, started {started_n} of {len(ids)}")
            await asyncio.sleep(1.0)
        lat = await latencies(conn, ids)
        hops, relays = await job_hops(conn, ids), await relay_delays(conn, ids)
    finally:
        await conn.close()
    return {"half_load_rate_per_s": round(offered, 1), "half_load_jobs": len(ids),
            "half_load_p50_ms": lat["placed_p50"], "half_load_p99_ms": lat["placed_p99"],
            "half_load_started_p50_ms": lat["started_p50"], "half_load_started_p99_ms": lat["started_p99"],
            "half_load_hops_ms": hops, "half_load_relay_ms": relays}


async def run_scale(args: argparse.Namespace, progress: Callable[[str], None] = print) -> dict:
    progress("the floor of a job's start: its processes started as an agent starts them, on the quiet machine ...")
    start_ms = await asyncio.to_thread(floor_job_start_ms)
    progress(f"phase 1: a burst of {args.jobs} jobs into {args.nodes} nodes x 8 GPUs")
    state = await up_for(args, progress)
    try:
        progress("  the floors: PostgreSQL batched appends, the broker's batched throughput ...")
        pg = await floor_pg_batch_events_per_s(state.database_url)
        broker = await floor_broker_msgs_per_s(state.kafka_bootstrap)
        result: dict = {"nodes": args.nodes, "gpus": args.nodes * 8, "jobs": args.jobs, "broker": args.broker,
                        "telemetry_interval_s": args.telemetry_s, "heartbeat_interval_s": 10.0}
        result.update(await burst(args, state, progress))
    finally:
        stack.down(progress=lambda line: None)
    result["floor_pg_batch_events_per_s"] = round(pg, 1)
    result["floor_broker_msgs_per_s"] = round(broker, 1)
    result["ratio_placed_per_s_to_pg_batch_events_per_s"] = round(result["placed_per_s"] / pg, 4)
    result["floor_job_start_ms"] = round(start_ms, 2)  # machine CPU per job's processes started (start_floor)
    result["job_start_bound_per_s"] = round(1000 * result["machine_cores"] / start_ms, 1) if start_ms > 0 else None
    if args.half_load_s > 0 and result["placed_per_s"] > 0:
        rate = result["placed_per_s"] / 2
        progress(f"phase 2: half load, {rate:.0f} jobs/s for {args.half_load_s:g}s on a fresh stack")
        state = await up_for(args, progress)
        try:
            result.update(await half_load(args, state, rate, progress))
        finally:
            stack.down(progress=lambda line: None)
    return result


def cmd_scale(args: argparse.Namespace) -> int:
    if stack.load() is not None:
        print("gpusched bench-scale: a stack is up; it starts its own (run `gpusched down` first)")
        return 1
    os.environ.setdefault("GPUSCHED_KAFKA_SESSION_TIMEOUT_MS", "10000")
    result = asyncio.run(run_scale(args, progress=lambda line: print(line, flush=True)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        flat = [(k, v) for k, v in result.items() if not isinstance(v, dict)]
        print("\n" + render(["METRIC", "VALUE"], flat))
        services = sorted(result["cpu_ms_per_job"])
        rows = [(s, result["cpu_ms_per_job"].get(s), result["idle_cores"].get(s), result["burst_cores"].get(s),
                 result["rss_mib"].get(s), result["rss_kib_per_waiting_job"].get(s)) for s in services]
        print("\n" + render(["SERVICE", "CPU MS/JOB (NET OF IDLE)", "IDLE CORES", "BURST CORES", "RSS MIB",
                             "KIB/WAITING JOB"], rows))
        if result.get("burst_stages"):
            stages = [(name, *(q.get(k) if q else None for k in ("t10_s", "t50_s", "t90_s", "t100_s", "per_s")))
                      for name, q in result["burst_stages"].items()]
            print("\n" + render(["BURST: STAGE", "10% BY S", "50% BY S", "90% BY S", "ALL BY S", "JOBS/S 10-90%"],
                                 stages))
        if result.get("half_load_hops_ms"):
            hops = hop_rows(result["half_load_hops_ms"])
            hops += [(f"{service}'s outbox row -> published", q["p50"], q["p90"], q["p99"])
                     for service, q in result["half_load_relay_ms"].items()]
            print("\n" + render(["HALF LOAD: HOP", "P50 MS", "P90 MS", "P99 MS"], hops))
    print(f"\nwritten to {out}")
    return 0
