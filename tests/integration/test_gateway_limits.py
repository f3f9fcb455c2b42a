"""The real gateway process under load, on real PostgreSQL: one tenant's flood of reads is answered with
429 problems (Retry-After) and held to its token bucket, while another tenant's steady reads all succeed
during it (the positive signal of isolation; its latency gets only a loose, relative bound: machines are
noisy). And the request limits in front of every route: a body over 1 MiB is 413, a non-numeric
Content-Length is 400."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gpusched_common.db import connect
from gpusched_common.infra.processes import free_port, spawn, stop_pid, wait_for_port
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.integration.test_gateway_api import JOBS, ROOT, assert_problem, bearer, issue, seed

READ_RATE_PER_S, READ_BURST = 5.0, 20.0
FLOOD_REQUESTS, FLOOD_TASKS = 400, 20
STEADY_READS, STEADY_GAP_S, BASELINE_READS = 15, 0.12, 5


@pytest.fixture
async def real_gateway(database_url: str, tmp_path: Path):
    """(base url, {tenant: a user's API token}, port) of a gateway process with small read limits."""
    conn = await connect(database_url)
    try:
        await seed(conn)
        names = {"a": await issue(conn, "user", "a"), "b": await issue(conn, "user", "b")}
    finally:
        await conn.close()
    port = free_port()
    env = {**os.environ, "GPUSCHED_DATABASE_URL": database_url, "GPUSCHED_GATEWAY_PORT": str(port),
           "GPUSCHED_GATEWAY_READ_RATE_PER_S": str(READ_RATE_PER_S),
           "GPUSCHED_GATEWAY_READ_BURST": str(READ_BURST)}
    pid = spawn("gateway", [sys.executable, "-m", "services.gateway"], tmp_path, env, cwd=ROOT)
    try:
        wait_for_port(port, pid=pid, log=tmp_path / "gateway.log")
        yield f"http://127.0.0.1:{port}", names, port
    finally:
        stop_pid(pid)
    log = (tmp_path / "gateway.log").read_text()
    assert all(token not in log for token in names.values())


async def timed_get(client: httpx.AsyncClient, token: str) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await client.get("/v1/jobs", headers=bearer(token))
    return response, time.perf_counter() - started


async def flood(client: httpx.AsyncClient, token: str, steady_done: asyncio.Event) -> list[httpx.Response]:
    """FLOOD_REQUESTS reads over FLOOD_TASKS concurrent tasks, and on until the steady reader is done (so
    the flood covers every one of its reads)."""
    responses: list[httpx.Response] = []

    async def worker() -> None:
        while len(responses) < FLOOD_REQUESTS or not steady_done.is_set():
            responses.append(await client.get("/v1/jobs", headers=bearer(token)))

    await asyncio.gather(*(worker() for _ in range(FLOOD_TASKS)))
    return responses


async def steady(client: httpx.AsyncClient, token: str, done: asyncio.Event) -> list[tuple[httpx.Response, float]]:
    """STEADY_READS reads, spaced to stay within the rate (with the baseline's, under the burst anyway)."""
    try:
        results = []
        for _ in range(STEADY_READS):
            results.append(await timed_get(client, token))
            await asyncio.sleep(STEADY_GAP_S)
        return results
    finally:
        done.set()


async def test_one_tenant_s_flood_is_rate_limited_while_another_tenant_s_reads_all_succeed(real_gateway):
    base_url, names, _ = real_gateway
    limits = httpx.Limits(max_connections=FLOOD_TASKS, max_keepalive_connections=FLOOD_TASKS)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=20) as a_client, \
            httpx.AsyncClient(base_url=base_url, timeout=20) as b_client:
        baseline = [await timed_get(b_client, names["b"]) for _ in range(BASELINE_READS)]
        assert all(r.status_code == 200 for r, _ in baseline), [r.text for r, _ in baseline]
        steady_done = asyncio.Event()
        started = time.perf_counter()
        flooding = asyncio.create_task(flood(a_client, names["a"], steady_done))
        await asyncio.sleep(0.2)  # the flood is under way (its burst spent) before b reads
        during = await steady(b_client, names["b"], steady_done)
        a_responses = await flooding
        elapsed_s = time.perf_counter() - started

    statuses = Counter(r.status_code for r in a_responses)
    assert set(statuses) == {200, 429}, statuses
    assert statuses[200] <= READ_BURST + READ_RATE_PER_S * elapsed_s + 5, (statuses, elapsed_s)
    refused = next(r for r in a_responses if r.status_code == 429)
    assert "exceeded its read rate" in assert_problem(refused, 429)["detail"]
    assert int(refused.headers["retry-after"]) >= 1
    assert all(r.status_code == 200 or "retry-after" in r.headers for r in a_responses)

    assert [r.status_code for r, _ in during] == [200] * STEADY_READS, [r.text for r, _ in during]
    assert all(sorted(j["job_id"] for j in r.json()["jobs"]) == JOBS["b"] for r, _ in during)
    before_s = statistics.median(s for _, s in baseline)
    during_s = statistics.median(s for _, s in during)
    # loose (the flood may slow b, not starve it); 10 ms floor: a fast baseline is mostly timer noise
    assert during_s < 20 * max(before_s, 0.01), (before_s, during_s)


async def test_a_body_over_one_mib_is_413_on_the_real_process(real_gateway):
    base_url, names, _ = real_gateway
    async with httpx.AsyncClient(base_url=base_url, timeout=20) as client:
        big = await client.post("/v1/jobs", headers=bearer(names["a"]), content=b"x" * (1024 * 1024 + 1))
        assert "limited to 1048576 bytes" in assert_problem(big, 413)["detail"]
        # the same size streamed without a Content-Length (chunked) is refused as it comes in
        streamed = await client.post("/v1/jobs", headers=bearer(names["a"]), content=chunks(17, 65536))
        assert_problem(streamed, 413)


async def chunks(count: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b"x" * size


def raw_request(port: int, head: str) -> bytes:
    """Sends a request as written (httpx would not send a bad Content-Length) and reads the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


async def test_a_non_numeric_content_length_is_400_on_the_real_process(real_gateway, database_url):
    _, names, port = real_gateway
    head = (f"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {names['a']}\r\n"
            "Content-Length: abc\r\nConnection: close\r\n\r\n")
    answer = await asyncio.to_thread(raw_request, port, head)
    # uvicorn's HTTP parser refuses it before the app sees it (a plain-text 400, not a problem detail)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert names["a"].encode() not in answer
    # the app's own check, for a server in front that would pass such a header on: a 400 problem
    app = create_app(GatewaySettings(database_url=database_url))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            response = await client.get("/v1/jobs", headers={**bearer(names["a"]), "Content-Length": "abc"})
    assert "Content-Length" in assert_problem(response, 400)["detail"]
