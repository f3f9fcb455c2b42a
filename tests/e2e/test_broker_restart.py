"""The broker restarts in the middle of a workload.

Apache Kafka keeps its logs and committed offsets across a restart: every event published before it is
still on its topic afterwards, and every job finishes exactly once. Tansu keeps nothing (it lives in
memory): the operator recreates the topics (`gpusched create-topics`) and the services converge from
PostgreSQL, the truth, all the same: what the lost messages would have done is done by each service's
periodic pass over the store (placement's and quota's recovery, StartJobs re-sent, nodes whose account
drifted from the store reconciled, lost exit reports sent again).
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
    try:
        counts = await wait_until_finished(local_stack.database_url, ids, timeout_s=180, interval_s=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{await _stories_of_the_odd(local_stack.database_url, ids)}") from None
    assert counts == {"Succeeded": 40}, await _stories_of_the_odd(local_stack.database_url, ids)
    await _assert_each_job_ran_once(local_stack.database_url, ids)
    if broker.keeps_data_across_restart:
        await _assert_every_job_event_is_on_the_topic(local_stack.database_url, broker.bootstrap, ids)


async def _stories_of_the_odd(database_url: str, ids: list[str]) -> str:
    """Every event of each job that did not succeed exactly once (what a failure message should show)."""
    conn = await connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT e.stream_id, e.type, e.payload, e.recorded_at FROM events e WHERE e.stream_id IN ("
            " SELECT 'job-' || job_id FROM jobs WHERE job_id = ANY($1::text[]) AND status <> 'Succeeded'"
            " UNION SELECT stream_id FROM events WHERE type IN ('JobPlaced', 'JobSucceeded')"
            " AND stream_id = ANY($2::text[]) GROUP BY stream_id, type HAVING count(*) > 1)"
            " ORDER BY e.stream_id, e.version", ids, [f"job-{i}" for i in ids])
    finally:
        await conn.close()
    return "\n".join(f"{r['stream_id']} {r['recorded_at']:%H:%M:%S.%f} {r['type']} {r['payload']}" for r in rows)


async def _assert_each_job_ran_once(database_url: str, ids: list[str]) -> None:
    conn = await connect(database_url)
    try:
        streams = [f"job-{i}" for i in ids]
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT stream_id, type FROM events WHERE type IN ('JobPlaced', 'JobSucceeded')"
            " AND stream_id = ANY($1::text[]) GROUP BY stream_id, type HAVING count(*) > 1) t", streams)
        assert twice == 0, await _stories_of_the_odd(database_url, ids)
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
