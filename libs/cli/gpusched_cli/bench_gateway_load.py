"""The load side of `make bench-gateway`: the floor app, the shots each phase fires, the workers that fire
them and their tallies; the floors of signing and producing."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from gpusched_common import producers
from gpusched_common.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI


TENANTS = ("research", "inference", "platform", "ml-eval")


def hello_app() -> FastAPI:
    from fastapi import FastAPI  # in the floor's process only

    app = FastAPI()

    @app.get("/hello")
    async def hello() -> dict[str, bool]:
        return {"ok": True}

    return app


def serve_hello(port: int, log_level: str) -> None:
    """The floor's server, run as services/gateway/__main__.py runs the gateway's."""
    import uvicorn

    uvicorn.run(hello_app(), host="127.0.0.1", port=port, log_level=log_level, timeout_keep_alive=10)


# --- the load ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shot:
    """One kind of request, its body encoded once (the client stays cheap); ``items``: what an answer
    accepted (jobs; a read or a hello counts one), 0 for a failure."""

    method: str
    path: str
    body: bytes | None
    items: Callable[[httpx.Response], int]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


@dataclass
class Tally:
    requests: int = 0
    items: int = 0
    by_path: dict[str, list[float]] = field(default_factory=dict)  # each answered request's latency, ms
    failures: Counter[str] = field(default_factory=Counter)
    elapsed_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.items / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, q: float, path: str | None = None) -> float:
        return percentile(self.by_path.get(path, []) if path else sum(self.by_path.values(), []), q)


@dataclass
class Load:
    connections: int
    shots: Sequence[Shot]
    tally: Tally = field(default_factory=Tally)


def _status(expected: int) -> Callable[[httpx.Response], int]:
    return lambda r: int(r.status_code == expected)


def _accepted(r: httpx.Response) -> int:
    return int(r.json()["accepted"]) if r.status_code == 200 else 0


def submission_shots(batch_size: int) -> tuple[Shot, Shot]:
    """(one job, a batch of ``batch_size``); no Idempotency-Key, so every request makes new jobs."""
    specs = [{"tenant": TENANTS[i % len(TENANTS)], "gpus": 1, "command": ["true"], "name": f"bench-{i}"}
             for i in range(batch_size)]
    return (Shot("POST", "/v1/jobs", json.dumps(specs[0]).encode(), _status(201)),
            Shot("POST", "/v1/jobs:batch", json.dumps({"jobs": specs}).encode(), _accepted))


READS = (Shot("GET", "/v1/jobs?limit=50", None, _status(200)), Shot("GET", "/v1/queue", None, _status(200)))
HELLO = (Shot("GET", "/hello", None, _status(200)),)


async def _worker(client: httpx.AsyncClient, load: Load, until: float, turn: int) -> None:
    tally = load.tally
    while time.perf_counter() < until:
        shot = load.shots[turn % len(load.shots)]
        turn += 1
        started = time.perf_counter()
        try:
            response = await client.request(shot.method, shot.path, content=shot.body)
        except httpx.HTTPError as exc:
            tally.failures[type(exc).__name__] += 1
            continue
        tally.by_path.setdefault(shot.path, []).append((time.perf_counter() - started) * 1000)
        tally.requests += 1
        items = shot.items(response)
        tally.items += items
        if not items:
            tally.failures[str(response.status_code)] += 1


async def _progress(label: str, tally: Tally, started: float, duration_s: float) -> None:
    while True:
        await asyncio.sleep(2.0)
        elapsed = time.perf_counter() - started
        print(f"  {label:<7} {elapsed:4.1f}/{duration_s:.0f}s  {tally.items} accepted"
              f" ({tally.items / elapsed:,.0f}/s)", flush=True)


async def run_phase(base_url: str, token: str | None, loads: Sequence[Load], duration_s: float, label: str) -> None:
    """Every load's workers for ``duration_s`` (a request in flight then is awaited and counted); the
    progress lines follow the first load."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    started = time.perf_counter()
    async with AsyncExitStack() as clients:
        workers = []
        for load in loads:
            client = await clients.enter_async_context(httpx.AsyncClient(
                base_url=base_url, headers=headers, timeout=60.0,
                limits=httpx.Limits(max_connections=load.connections, max_keepalive_connections=load.connections)))
            workers += [_worker(client, load, started + duration_s, turn) for turn in range(load.connections)]
        ticker = asyncio.create_task(_progress(label, loads[0].tally, started, duration_s))
        try:
            await asyncio.gather(*workers)
        finally:
            ticker.cancel()
    for load in loads:
        load.tally.elapsed_s = time.perf_counter() - started


# --- the floors beside HTTP -------------------------------------------------------------------------------

def floor_sign_per_s(key: producers.ProducerKey, value: bytes, n: int = 2000) -> float:
    started = time.perf_counter()
    for _ in range(n):
        key.headers(value)
    return n / (time.perf_counter() - started)


async def floor_produce_per_s(bootstrap: str, idempotence: bool, value: bytes, headers: list[tuple[str, bytes]],
                              duration_s: float, burst: int) -> float:
    """Records/s one producer configured as the gateway's publishes in bursts of ``burst``, each burst's
    acks awaited together (as a batch is), on a topic of its own."""
    topic = f"gpusched.bench.floor.{int(time.time() * 1000)}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)  # Apache Kafka creates no topic on first use
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, int(os.environ.get("GPUSCHED_KAFKA_PARTITIONS", "6")), 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=idempotence,
                                linger_ms=2, max_request_size=Settings().kafka_max_request_bytes)
    await producer.start()
    try:
        sent, started = 0, time.perf_counter()
        while time.perf_counter() < started + duration_s:
            acks = [await producer.send(topic, value, key=str(sent + i).encode(), headers=headers)
                    for i in range(burst)]
            await asyncio.gather(*acks)
            sent += burst
        return sent / (time.perf_counter() - started)
    finally:
        await producer.stop()


