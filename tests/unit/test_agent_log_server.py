"""The agent's log server answers only requests the gateway signed, recently: a forged, unsigned, replayed
or tampered request is 401; an unknown node or job is 404; a chunk comes with where the next one starts."""

from __future__ import annotations

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gpusched_common.producers import ProducerKey
from services.node_agent.log_server import log_app

NOW = 1_800_000_000.0
GATEWAY = ProducerKey("0123456789abcdef", Ed25519PrivateKey.generate())
STRANGER = ProducerKey("fedcba9876543210", Ed25519PrivateKey.generate())


@pytest.fixture
def client(tmp_path):
    (tmp_path / "j1.log").write_bytes(b"line 1\nline 2\n")
    app = log_app(GATEWAY.public_key_text(), {"n1": lambda job_id: tmp_path / f"{job_id}.log"}, clock=lambda: NOW)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent")


async def get(client, target: str, key: ProducerKey | None = GATEWAY, at: float = NOW, signed_target: str | None = None):
    headers = key.request_headers("GET", signed_target or target, at) if key else {}
    return await client.get(target, headers=headers)


async def test_the_gateway_reads_a_log_in_chunks(client):
    whole = await get(client, "/logs/n1/j1")
    assert whole.status_code == 200 and whole.content == b"line 1\nline 2\n"
    part = await get(client, "/logs/n1/j1?offset=7&limit=3")
    assert part.content == b"lin" and part.headers["x-log-next-offset"] == "10" and part.headers["x-log-size"] == "14"


@pytest.mark.parametrize(("case", "kw"), [
    ("unsigned", {"key": None}),
    ("another key", {"key": STRANGER}),
    ("replayed later", {"at": NOW - 300}),
    ("signed for another job", {"signed_target": "/logs/n1/j2"}),
])
async def test_anything_but_a_fresh_gateway_request_is_refused(client, case, kw):
    assert (await get(client, "/logs/n1/j1", **kw)).status_code == 401, case


async def test_unknown_nodes_and_jobs_are_not_found(client):
    assert (await get(client, "/logs/n2/j1")).status_code == 404
    assert (await get(client, "/logs/n1/nope")).status_code == 404
    assert (await get(client, "/logs/n1/j1?offset=x")).status_code == 400


async def test_a_log_gone_past_its_retention_says_how_long_logs_are_kept(client):
    gone = await get(client, "/logs/n1/j9")
    assert gone.status_code == 404 and "kept 7d after its last write" in gone.json()["detail"]
