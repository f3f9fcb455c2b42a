"""`make bench-gateway`: the jobs/s the gateway accepts and its read latency under load, beside same-run floors.

Starts a broker (Tansu unless --broker kafka; --bootstrap: a running one), a database (as `gpusched up` finds
one; --database-url: a given one), the gateway as its own process with its producer key and its rate limits
out of the way, and a bare uvicorn app whose one route `GET /hello` answers {"ok": true}, started and loaded
the same way. Each phase runs --duration seconds, driven by httpx clients in this process:

- floor:  GET /hello, --concurrency connections (what this machine's HTTP stack serves doing nothing);
- submit: POST /v1/jobs, one job a request, --concurrency connections;
- batch:  POST /v1/jobs:batch of --batch-size jobs, --batch-concurrency requests in flight;
- reads:  GET /v1/jobs?limit=50 and GET /v1/queue by turns, --read-concurrency connections, while
  --concurrency single submitters go on (--seed-jobs admitted jobs, all waiting in the queue).

Two more floors bound the batch rate: one aiokafka producer in this process publishing records of the
gateway's size as the gateway does, without HTTP or signing; and Ed25519 signatures of one envelope.
Accepted means acknowledged by the broker (the gateway answers after acks=all); the bench checks that the
topic grew by as many records. Admission does not run. The load generator shares the CPUs with the gateway,
the broker and PostgreSQL, and takes a share the gateway could have had. --profile runs the gateway under
cProfile and prints its top costs. Results print as a table and go to bench-results/gateway.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import shutil
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from aiokafka import AIOKafkaConsumer

from gpusched_cli import stack
from gpusched_common import events as ev
from gpusched_common import producers, tokens
from gpusched_common.db import connect, migrate
from gpusched_common.infra import postgres
from gpusched_common.infra.brokers import BROKER_KINDS, RunningBroker, start_broker, stop_broker
from gpusched_common.infra.processes import free_port, spawn, stop_pid, wait_for_port
from gpusched_common.jobs import append_job_events, load_job, new_job_id, submission_bytes
from gpusched_common.kafka_admin import create_topics
from gpusched_common.settings import Settings
from gpusched_common.table import render
from gpusched_common.topics import JOBS_SUBMITTED
from gpusched_core import lifecycle

from gpusched_cli.bench_gateway_load import (
    HELLO,
    READS,
    TENANTS,
    Load,
    Tally,
    floor_produce_per_s,
    floor_sign_per_s,
    run_phase,
    submission_shots,
)

if TYPE_CHECKING:
    pass

GOAL_BATCH_JOBS_PER_S = 3000.0  # the issue's goal, on 2 cores
UNLIMITED = "1000000000"  # the gateway's per-principal rate limits, out of the bench's way
REPO = Path(__file__).resolve().parents[3]


def add_bench_gateway_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=6.0, help="seconds each phase runs (default 6)")
    p.add_argument("--concurrency", type=int, default=8, help="connections of the floor and the single submits")
    p.add_argument("--batch-size", type=int, default=1000, help="jobs in one POST /v1/jobs:batch (at most 1000)")
    p.add_argument("--batch-concurrency", type=int, default=2, help="batch requests in flight")
    p.add_argument("--read-concurrency", type=int, default=4, help="readers in the reads phase")
    p.add_argument("--seed-jobs", type=int, default=500, help="jobs put in the read model before the reads")
    p.add_argument("--log-level", default="info", help="the gateway's and the floor's (info: uvicorn's access log)")
    p.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    p.add_argument("--bootstrap", help="a running broker to use instead of starting one")
    p.add_argument("--database-url", help="a database to use (migrated here) instead of one prepare_database finds")
    p.add_argument("--home", help="logs and a private PostgreSQL (default: .gpusched/bench-gateway)")
    p.add_argument("--profile", metavar="PATH", help="run the gateway under cProfile, its stats written to PATH")
    p.add_argument("--out", default="bench-results/gateway.json")


def cmd_bench_gateway(args: argparse.Namespace) -> int:
    return asyncio.run(run_bench(args))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench-gateway", description=__doc__.split("\n", 1)[0])
    add_bench_gateway_arguments(parser)
    return cmd_bench_gateway(parser.parse_args(argv))


@dataclass
class Infra:
    home: Path
    bootstrap: str
    database_url: str
    idempotence: bool
    broker: RunningBroker | None = None
    private_pg: postgres.PrivatePostgres | None = None
    pids: list[int] = field(default_factory=list)


async def start_infra(args: argparse.Namespace, home: Path) -> Infra:
    """A broker with the topics and a migrated database, each the one given or one started here."""
    infra = Infra(home, args.bootstrap or "", args.database_url or "", Settings().kafka_idempotence)
    try:
        if not args.bootstrap:
            infra.broker = start_broker(args.broker, home / "broker")
            infra.bootstrap, infra.idempotence = infra.broker.bootstrap, infra.broker.idempotence
            print(f"broker     {infra.broker.label()} on {infra.bootstrap}")
        await create_topics(infra.bootstrap, int(os.environ.get("GPUSCHED_KAFKA_PARTITIONS", "6")))
        if not args.database_url:
            infra.database_url, _, infra.private_pg = await stack.prepare_database(home, "gpusched_bench_gateway", True)
        await migrate(infra.database_url)
        print(f"database   {infra.database_url}")
        return infra
    except BaseException:
        stop_infra(infra)
        raise


def stop_infra(infra: Infra) -> None:
    for pid in reversed(infra.pids):
        stop_pid(pid)
    if infra.broker is not None:
        stop_broker(infra.broker)
    if infra.private_pg is not None:
        postgres.stop_private(infra.private_pg)


def _serve(infra: Infra, name: str, argv: list[str], env: dict[str, str], port: int) -> str:
    pid = spawn(name, argv, infra.home / "logs", {**os.environ, "PYTHONUNBUFFERED": "1", **env}, cwd=REPO)
    infra.pids.append(pid)
    wait_for_port(port, 30.0, pid=pid, log=infra.home / "logs" / f"{name}.log")
    return f"http://127.0.0.1:{port}"


def start_hello(infra: Infra, log_level: str) -> str:
    port = free_port()
    code = f"from gpusched_cli.bench_gateway_load import serve_hello; serve_hello({port}, {log_level!r})"
    return _serve(infra, "hello", [sys.executable, "-c", code], {}, port)


def gateway_argv(profile: str | None) -> list[str]:
    if profile is None:
        return [sys.executable, "-m", "services.gateway"]
    # uvicorn re-raises SIGTERM once it has shut down: as SystemExit, cProfile still writes its stats
    code = ("import cProfile, runpy, signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
            f"cProfile.run('runpy.run_module(\"services.gateway\", run_name=\"__main__\")', {profile!r})")
    return [sys.executable, "-c", code]


async def provision(database_url: str, key_file: Path) -> tuple[producers.ProducerKey, str]:
    """The gateway's producer key (written to ``key_file``) and an operator token for the load."""
    conn = await connect(database_url)
    try:
        now = datetime.now(UTC)
        key = await producers.ensure(conn, key_file, name="gateway", tenants=("*",), attests=True,
                                     created_by="bench", now=now)
        token, _ = await tokens.issue(conn, role="operator", tenant=None, name="bench", expires_at=None,
                                      created_by="bench", now=now)
        return key, token
    finally:
        await conn.close()


async def start_gateway(infra: Infra, key_file: Path, log_level: str, profile: str | None) -> str:
    """The gateway's URL, once /readyz says it reaches the database and the broker."""
    port = free_port()
    env = {"GPUSCHED_DATABASE_URL": infra.database_url, "GPUSCHED_KAFKA_BOOTSTRAP": infra.bootstrap,
           "GPUSCHED_KAFKA_IDEMPOTENCE": str(infra.idempotence).lower(), "GPUSCHED_GATEWAY_PORT": str(port),
           "GPUSCHED_GATEWAY_PRODUCER_KEY_FILE": str(key_file), "GPUSCHED_LOG_LEVEL": log_level.upper(),
           **{f"GPUSCHED_GATEWAY_{kind}_{limit}": UNLIMITED for kind in ("SUBMIT", "READ")
              for limit in ("RATE_PER_S", "BURST")}}
    url = _serve(infra, "gateway", gateway_argv(profile), env, port)
    async with httpx.AsyncClient(base_url=url) as client:
        deadline = time.monotonic() + 30.0
        while (ready := await client.get("/readyz")).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway is not ready after 30s: {ready.text}")
            await asyncio.sleep(0.2)
    return url


async def seed_jobs(database_url: str, count: int) -> None:
    """Jobs in the read model as admission registers them (Admitted: no quota service runs), for the reads
    to return: /v1/jobs pages through them, /v1/queue lists every one as waiting for quota."""
    conn = await connect(database_url)
    try:
        now = datetime.now(UTC)
        async with conn.transaction():  # one commit: the seed is not what is measured
            for i in range(count):
                spec = ev.JobSpec(tenant=TENANTS[i % len(TENANTS)], gpus=1, command=["true"], name=f"seed-{i}")
                state = await load_job(conn, new_job_id())
                await append_job_events(conn, state, lifecycle.decide(
                    state, lifecycle.RegisterSubmission(spec, now), now), producer="bench", now=now)
    finally:
        await conn.close()


async def topic_records(bootstrap: str, at_least: int = 0, timeout_s: float = 60.0) -> int:
    """Records on the submissions topic, read from its beginning until at least ``at_least`` and then a
    poll that finds no more (read, not taken from end offsets: Tansu's lag behind its last batch)."""
    consumer = AIOKafkaConsumer(JOBS_SUBMITTED.name, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, max_poll_records=5000)
    await consumer.start()  # no group: it takes every partition itself
    try:
        count, deadline = 0, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            read = sum(len(records) for records in (await consumer.getmany(timeout_ms=1000)).values())
            count += read
            if not read and count >= at_least:
                break
        return count
    finally:
        await consumer.stop()


# --- the run ----------------------------------------------------------------------------------------------

PHASES = ("floor", "submit", "batch", "reads", "submit_beside_reads")


async def measure_floors(args: argparse.Namespace, infra: Infra, key: producers.ProducerKey) -> dict:
    """Beside HTTP: records/s of a producer alone, Ed25519 signatures/s."""
    spec = ev.JobSpec(tenant=TENANTS[0], gpus=1, command=["true"], name="bench-0")
    value = submission_bytes(spec, new_job_id(), producer="gateway", submitted_by="token:bench")
    headers = [(k, v.encode()) for k, v in {"event-type": ev.JobSubmitted.TYPE, **key.headers(value)}.items()]
    floors = {"floor_sign_per_s": round(floor_sign_per_s(key, value), 1), "floor_produce_per_s": round(
        await floor_produce_per_s(infra.bootstrap, infra.idempotence, value, headers, args.duration, args.batch_size), 1)}
    print(f"floor      {floors['floor_produce_per_s']:,.0f} records/s from one producer in this process,"
          f" {floors['floor_sign_per_s']:,.0f} Ed25519 signatures/s")
    return floors


async def measure_hello(args: argparse.Namespace, url: str, when: str) -> Tally:
    print(f"floor      GET /hello for {args.duration / 2:.0f}s over {args.concurrency} connections ({when})")
    hello = Load(args.concurrency, HELLO)
    await run_phase(url, None, [hello], args.duration / 2, "floor")
    return hello.tally


async def measure(args: argparse.Namespace, infra: Infra) -> tuple[dict[str, Tally], dict, int]:
    """Each phase's tally, the floors beside HTTP, and how many records the submissions topic gained. The
    hello floor runs first and last (half as long each), its better run kept: the machine may be shared."""
    key_file = infra.home / "gateway-producer.key"
    key, token = await provision(infra.database_url, key_file)
    hello_url = start_hello(infra, args.log_level)
    hello = await measure_hello(args, hello_url, "first")
    floors = await measure_floors(args, infra, key)
    if args.seed_jobs:
        await seed_jobs(infra.database_url, args.seed_jobs)
        print(f"seeded     {args.seed_jobs} jobs into the read model")
    url = await start_gateway(infra, key_file, args.log_level, args.profile)
    print(f"gateway    {url}" + (f" (under cProfile: {args.profile})" if args.profile else ""))
    before = await topic_records(infra.bootstrap)
    single, batch = submission_shots(args.batch_size)
    submit, batches = Load(args.concurrency, (single,)), Load(args.batch_concurrency, (batch,))
    reads, beside = Load(args.read_concurrency, READS), Load(args.concurrency, (single,))
    print(f"submit     POST /v1/jobs for {args.duration:.0f}s over {args.concurrency} connections")
    await run_phase(url, token, [submit], args.duration, "submit")
    print(f"batch      POST /v1/jobs:batch of {args.batch_size}, {args.batch_concurrency} in flight")
    await run_phase(url, token, [batches], args.duration, "batch")
    print(f"reads      GET /v1/jobs?limit=50, /v1/queue over {args.read_concurrency} connections,"
          f" beside {args.concurrency} submitters")
    await run_phase(url, token, [reads, beside], args.duration, "reads")
    again = await measure_hello(args, hello_url, "last")
    floors["floor_hello_runs_per_s"] = [round(hello.per_s, 1), round(again.per_s, 1)]
    tallies = dict(zip(PHASES, (max(hello, again, key=lambda t: t.per_s), submit.tally, batches.tally,
                                reads.tally, beside.tally), strict=True))
    accepted = submit.tally.items + batches.tally.items + beside.tally.items
    return tallies, floors, await topic_records(infra.bootstrap, before + accepted) - before


def _ratio(value: float, floor: float) -> float:
    return round(value / floor, 3) if floor else 0.0


def summarize(args: argparse.Namespace, tallies: dict[str, Tally], floors: dict, topic_gain: int) -> dict:
    t = tallies
    ms = {name: (round(x.percentile_ms(0.5), 2), round(x.percentile_ms(0.99), 2)) for name, x in t.items()}
    return {
        "submit_per_s": round(t["submit"].per_s, 1), "batch_submit_jobs_per_s": round(t["batch"].per_s, 1),
        "read_p50_ms": ms["reads"][0], "read_p99_ms": ms["reads"][1], "floor_hello_per_s": round(t["floor"].per_s, 1),
        "floor_hello_p50_ms": ms["floor"][0], "floor_hello_p99_ms": ms["floor"][1], **floors,
        "submit_p50_ms": ms["submit"][0], "submit_p99_ms": ms["submit"][1],
        "batch_request_p50_ms": ms["batch"][0], "batch_request_p99_ms": ms["batch"][1],
        "read_jobs_p50_ms": round(t["reads"].percentile_ms(0.5, READS[0].path), 2),
        "read_jobs_p99_ms": round(t["reads"].percentile_ms(0.99, READS[0].path), 2),
        "read_queue_p50_ms": round(t["reads"].percentile_ms(0.5, READS[1].path), 2),
        "read_queue_p99_ms": round(t["reads"].percentile_ms(0.99, READS[1].path), 2),
        "read_per_s": round(t["reads"].per_s, 1), "submit_beside_reads_per_s": round(t["submit_beside_reads"].per_s, 1),
        "ratio_submit_to_floor_hello": _ratio(t["submit"].per_s, t["floor"].per_s),
        "ratio_batch_jobs_to_floor_hello": _ratio(t["batch"].per_s, t["floor"].per_s),
        "ratio_batch_jobs_to_floor_produce": _ratio(t["batch"].per_s, floors["floor_produce_per_s"]),
        "ratio_read_p50_to_floor_hello_p50": _ratio(ms["reads"][0], ms["floor"][0]),
        "goal_batch_jobs_per_s": GOAL_BATCH_JOBS_PER_S, "goal_met": t["batch"].per_s >= GOAL_BATCH_JOBS_PER_S,
        "jobs_accepted": sum(t[name].items for name in ("submit", "batch", "submit_beside_reads")),
        "topic_records": topic_gain,
        "failures": {name: dict(x.failures) for name, x in t.items() if x.failures},
        "config": {"duration_s": args.duration, "concurrency": args.concurrency, "batch_size": args.batch_size,
                   "batch_concurrency": args.batch_concurrency, "read_concurrency": args.read_concurrency,
                   "seed_jobs": args.seed_jobs, "log_level": args.log_level, "profiled": bool(args.profile),
                   "broker": "given" if args.bootstrap else args.broker, "cpu_count": os.cpu_count(),
                   "load_average_1m_at_end": round(os.getloadavg()[0], 2),
                   "load_generator": "httpx.AsyncClient in the bench process, on the same CPUs"},
    }


def phase_rows(args: argparse.Namespace, tallies: dict[str, Tally], result: dict) -> list[list[object]]:
    what = {"floor": ("GET /hello (bare uvicorn app)", "hello/s"), "submit": ("POST /v1/jobs", "jobs/s"),
            "batch": (f"POST /v1/jobs:batch ({args.batch_size} jobs)", "jobs/s"),
            "reads": ("GET /v1/jobs, /v1/queue (beside submits)", "reads/s"),
            "submit_beside_reads": ("POST /v1/jobs (beside reads)", "jobs/s")}
    hello = tallies["floor"].per_s
    rows: list[list[object]] = [
        [name, what[name][0], t.requests, f"{t.per_s:,.0f} {what[name][1]}", t.percentile_ms(0.5),
         t.percentile_ms(0.99), _ratio(t.per_s, hello), sum(t.failures.values())] for name, t in tallies.items()]
    rows.insert(1, ["floor", "one producer, no HTTP, no signing", None,
                    f"{result['floor_produce_per_s']:,.0f} records/s", None, None, None, None])
    rows.insert(2, ["floor", "Ed25519 signature of an envelope", None,
                    f"{result['floor_sign_per_s']:,.0f} signs/s", None, None, None, None])
    return rows


def profile_rows(path: str, top: int = 15) -> list[list[object]]:
    """The gateway's functions that took the most time of their own (cProfile's tottime; a coroutine's
    calls count each resumption), but the event loop's wait in epoll (idle, not a cost)."""
    entries = pstats.Stats(path).stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, _)}
    costs = [(where, stats) for where, stats in entries.items() if "select.epoll" not in where[2]]
    ranked = sorted(costs, key=lambda kv: -kv[1][2])[:top]
    return [[name if file == "~" else f"{Path(file).name}:{line}({name})", nc, round(tt, 3), round(ct, 3)]
            for (file, line, name), (_, nc, tt, ct, _) in ranked]


def report(args: argparse.Namespace, tallies: dict[str, Tally], result: dict) -> None:
    print()
    print(render(["PHASE", "WHAT", "REQUESTS", "RATE", "P50 MS", "P99 MS", "VS HELLO", "FAILED"],
                 phase_rows(args, tallies, result)))
    cpus = os.cpu_count()
    print(f"\nbatch: {result['batch_submit_jobs_per_s']:,.0f} jobs/s accepted; goal >= {GOAL_BATCH_JOBS_PER_S:,.0f}"
          f" on 2 cores: {'met' if result['goal_met'] else 'NOT met'} (this machine: {cpus} CPUs,"
          f" load average {result['config']['load_average_1m_at_end']})")
    print(f"the load generator ran in this process on the same {cpus} CPUs as the gateway, the broker and"
          " PostgreSQL: it takes a share of what the gateway could have")
    print(f"reads: /v1/jobs?limit=50 p50 {result['read_jobs_p50_ms']} ms, p99 {result['read_jobs_p99_ms']} ms;"
          f" /v1/queue ({args.seed_jobs} waiting) p50 {result['read_queue_p50_ms']} ms, p99 {result['read_queue_p99_ms']} ms")
    print(f"{JOBS_SUBMITTED.name}: +{result['topic_records']} records for {result['jobs_accepted']} accepted jobs")
    if result["failures"]:
        print(f"failures: {result['failures']}")
    if args.profile:
        print(f"\nthe gateway's top costs (cProfile, own time; {args.profile}):")
        print(render(["FUNCTION", "CALLS", "OWN S", "CUMULATIVE S"], profile_rows(args.profile)))


async def run_bench(args: argparse.Namespace) -> int:
    home = Path(args.home) if args.home else stack.home_dir() / "bench-gateway"
    shutil.rmtree(home / "logs", ignore_errors=True)
    home.mkdir(parents=True, exist_ok=True)
    infra = await start_infra(args, home)
    try:
        tallies, floors, topic_gain = await measure(args, infra)
    finally:
        stop_infra(infra)  # the gateway first: under --profile, it writes its stats as it stops
    result = summarize(args, tallies, floors, topic_gain)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    report(args, tallies, result)
    print(f"\nwritten to {out} (logs in {home / 'logs'})")
    complete = all(t.items for t in tallies.values()) and topic_gain == result["jobs_accepted"]
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
