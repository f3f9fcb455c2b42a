"""No secret leaves where it is kept: after a workload through the gateway (submissions, a dependency, a
cancel, a job that prints its whole environment, logs) and a tenant-key submission on the bus, no tenant
key secret, API token, producer or service key, or database role password appears in any table, in the
outbox, on any topic (values and headers), in any service's or job's log, or in the traces."""

from __future__ import annotations

import asyncio
import urllib.parse
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from gpusched import Client
from gpusched.config import read_config
from gpusched_cli.client import Client as BusClient
from gpusched_cli.workload import wait_until_finished
from gpusched_common.credentials import load_keys
from gpusched_common.db import connect
from gpusched_common.topics import ALL_TOPICS
from tests.builders import a_job
from tests.e2e.test_job_control import token_for, wait_state

STACK_NODES = 1
STACK_GPU_MODELS = ["H100-80GB"]
STACK_GPUS_PER_NODE = 4


def _key_secrets(text: str) -> list[str]:
    """A ``gsk_``/``gst_`` key text and its secret part (``<prefix>_<id>_<secret>``)."""
    text = text.strip()
    return [text, text.split("_", 2)[2]] if text.count("_") >= 2 else [text]


def secrets_of(local_stack, user_token: str) -> dict[str, str]:
    home = Path(local_stack.home)
    found: dict[str, str] = {}
    for key in load_keys(Path(local_stack.env["GPUSCHED_TENANT_KEYS_FILE"])).values():
        found[f"tenant key {key.key_id}"] = key.secret.decode()
    keys = [home / "gateway-producer.key", *sorted((home / "service-keys").glob("*.key")), home / "join-token",
            *sorted((home / "agents").glob("*/node.key"))]  # the agents' join token and each node's own key
    assert len(keys) >= 5, keys
    for path in keys:
        for i, text in enumerate(_key_secrets(path.read_text())):
            found[f"{path.parent.name}/{path.name}[{i}]"] = text
    for name, token in (("operator token", read_config(Path(local_stack.config_path))["token"]), ("user token", user_token)):
        for i, text in enumerate(_key_secrets(token)):
            found[f"{name}[{i}]"] = text
    environ = Path(f"/proc/{local_stack.processes['gateway']}/environ").read_bytes().split(b"\0")
    url = next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"GPUSCHED_GATEWAY_DATABASE_URL="))
    found["gateway role password"] = urllib.parse.urlsplit(url).password or ""
    return {name: text for name, text in found.items() if len(text) >= 12}


async def everything_stored(database_url: str) -> str:
    conn = await connect(database_url)
    try:
        tables = [r["table_name"] for r in await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            " AND table_type = 'BASE TABLE'")]
        parts = [await conn.fetchval(f'SELECT coalesce(string_agg(t::text, E\'\\n\'), \'\') FROM "{table}" t')
                 for table in tables]
        parts += [r["v"] + r["h"] for r in await conn.fetch(
            "SELECT convert_from(value, 'UTF8') AS v, headers::text AS h FROM outbox")]
        return "\n".join(parts)
    finally:
        await conn.close()


async def everything_on_the_bus(bootstrap: str) -> str:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()  # Apache Kafka sends no metadata unasked
        parts = [TopicPartition(t.name, p) for t in ALL_TOPICS for p in cluster.partitions_for_topic(t.name) or ()]
        assert parts, "no gpusched topic found on the broker"
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: list[str] = []
        deadline = asyncio.get_running_loop().time() + 30
        while [p for p in parts if await consumer.position(p) < ends[p]]:
            assert asyncio.get_running_loop().time() < deadline, "could not read every topic to its end"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    out.append((r.value or b"").decode(errors="replace"))
                    out.extend(v.decode(errors="replace") for _, v in r.headers or ())
        return "\n".join(out)
    finally:
        await consumer.stop()


def everything_written(local_stack) -> str:
    home = Path(local_stack.home)
    paths = [*home.glob("logs/*"), *home.glob("agents/*/*.log"), home / "traces.jsonl"]
    return "\n".join(p.read_text(errors="replace") for p in paths if p.is_file())


async def test_no_secret_reaches_the_store_the_bus_the_logs_or_the_traces(local_stack, stack_settings):
    token = await token_for(local_stack, "user", "research", "secret-keeper")
    with Client(local_stack.gateway, token) as client:
        shown = client.submit({"gpus": 1, "command": ["sh", "-c", "env; echo done"], "name": "print-env"})["job_id"]
        after = client.submit({"gpus": 1, "command": ["true"], "after": [{"job_id": shown}]})["job_id"]
        doomed = client.submit({"gpus": 1, "command": ["sleep", "600"]})["job_id"]
        await wait_state(client, doomed, "Running")
        client.cancel(doomed)
        await wait_state(client, after, "Succeeded", timeout_s=90)
        await wait_state(client, doomed, "Cancelled")
        assert b"done" in (await asyncio.to_thread(client.logs, shown))[0]
    async with BusClient(stack_settings) as bus:  # signed with a tenant key on the bus
        signed = await bus.submit(a_job("x").tenant("research").spec())
    await wait_until_finished(local_stack.database_url, [signed], timeout_s=60, interval_s=0.2)

    secrets = secrets_of(local_stack, token)
    assert len(secrets) >= 8, sorted(secrets)
    for where, text in (("the database", await everything_stored(local_stack.database_url)),
                        ("the broker", await everything_on_the_bus(local_stack.kafka_bootstrap)),
                        ("the logs and traces", everything_written(local_stack))):
        assert shown in text, f"the scan does not see {where}"  # what is there to see is seen
        leaked = sorted(name for name, secret in secrets.items() if secret in text)
        assert not leaked, f"{', '.join(leaked)} found in {where}"
