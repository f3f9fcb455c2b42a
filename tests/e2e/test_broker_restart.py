"""The broker restarts in the middle of a workload.

Apache Kafka keeps its logs and committed offsets across a restart: every event published before it is
still on its topic afterwards, and every job finishes exactly once. Tansu keeps nothing (it lives in
memory): the operator recreates the topics (`gpusched create-topics`) and the services should converge
from PostgreSQL, the truth, all the same; they do not yet (BROKER_SKIP), so that run is skipped with why.
"""

from __future__ import annotations

import asyncio
import json

from gpusched_common.db import connect
from gpusched_common.infra.brokers import restart_broker
from gpusched_common.kafka_admin import create_topics
from gpusched_common.topics import JOBS_EVENTS
from gpusched_cli import stack
from gpusched_cli.client import Client
from gpusched_cli.workload import wait_until_finished
from tests.builders import a_job
from tests.integration.kafka_helpers import read_topic

STACK_NODES = 2
# Seen here: after Tansu loses everything, jobs stay Running (their exit report was lost with the broker)
# or Queued (a StartJob lost), and a consumer whose in-memory position outlived the broker's data skips
# records published before it rejoins its group. Converging needs commands and reports re-sent until
# acknowledged and consumers that restart from the store: the fault-campaign issue (15), which removes this.
BROKER_SKIP = {"tansu": "a Tansu restart does not converge yet: lost StartJob/exit reports are never re-sent "
                        "and a stale consumer position skips new records (issue 15)"}
BROKER_BEHAVIOUR = True  # what the broker keeps across a restart: its Apache Kafka run is part of `make test`


async def _count_with_status(database_url: str, ids: list[str], status: str) -> int:
    conn = await connect(database_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM jobs WHERE job_id = ANY($1::text[]) AND status = $2",
                                   ids, status)
    finally:
        await conn.close()


async def _wait_for_running(database_url: str, ids: list[str], at_least: int, timeout_s: float = 60) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await _count_with_status(database_url, ids, "Running") < at_least:
        assert asyncio.get_running_loop().time() < deadline, f"fewer than {at_least} jobs running in time"
        await asyncio.sleep(0.1)


async def test_a_broker_restart_mid_workload_loses_no_job_and_runs_none_twice(local_stack, stack_settings):
    specs = [a_job("x").tenant(f"restart-{i % 3}").gpus(1 + i % 2).command("sleep", str(1 + i % 3)).spec()
             for i in range(40)]
    async with Client(stack_settings) as client:
        ids = [await client.submit(spec) for spec in specs[:24]]
    await _wait_for_running(local_stack.database_url, ids, at_least=4)
    broker = local_stack.running_broker
    restart_broker(broker)
    local_stack.broker = broker.to_json()
    stack.save(local_stack)  # `down` stops the new pid
    if not broker.keeps_data_across_restart:
        await create_topics(broker.bootstrap, partitions=6)
    async with Client(stack_settings) as client:
        ids += [await client.submit(spec) for spec in specs[24:]]
    counts = await wait_until_finished(local_stack.database_url, ids, timeout_s=180, interval_s=0.5)
    assert counts == {"Succeeded": 40}
    await _assert_each_job_ran_once(local_stack.database_url, ids)
    if broker.keeps_data_across_restart:
        await _assert_every_job_event_is_on_the_topic(local_stack.database_url, broker.bootstrap, ids)


async def _assert_each_job_ran_once(database_url: str, ids: list[str]) -> None:
    conn = await connect(database_url)
    try:
        streams = [f"job-{i}" for i in ids]
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT stream_id, type FROM events WHERE type IN ('JobPlaced', 'JobSucceeded')"
            " AND stream_id = ANY($1::text[]) GROUP BY stream_id, type HAVING count(*) > 1) t", streams)
        assert twice == 0
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 0
    finally:
        await conn.close()


async def _assert_every_job_event_is_on_the_topic(database_url: str, bootstrap: str, ids: list[str]) -> None:
    """What Kafka acknowledged before the restart is still there after it: the topic holds every event
    the store recorded for these jobs (the relay may have published some twice; none is missing)."""
    conn = await connect(database_url)
    try:
        stored = {str(r["event_id"]) for r in await conn.fetch(
            "SELECT event_id FROM events WHERE stream_id = ANY($1::text[])", [f"job-{i}" for i in ids])}
        deadline = asyncio.get_running_loop().time() + 30
        while await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL AND topic = $1",
                                  JOBS_EVENTS.name):
            assert asyncio.get_running_loop().time() < deadline, "the outbox did not drain"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    on_topic = {json.loads(r.value)["event_id"] for r in await read_topic(bootstrap, JOBS_EVENTS.name,
                                                                          expect=len(stored), timeout_s=30)}
    assert stored - on_topic == set()
