"""Node agents read only their own nodes' partitions of the command topic (issue 16), on the real broker:
the partitions are assigned by hand from the topic's partition count and the producers' partitioner, so an
agent (or a fleet) is given exactly the partitions its nodes hash to, runs its own commands, never sees the
commands of nodes on other partitions, drops those of nodes on its own before checking them, and a restarted
agent resumes from the offset its group committed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import datetime, timezone

from aiokafka import TopicPartition

from gpusched_common import events as ev
from gpusched_common.db import create_pool
from gpusched_common.kafka_admin import group_backlog, partition_count
from gpusched_common.messaging import Incoming, build_broker, publish
from gpusched_common.partitioning import partition_for, partitions_for
from gpusched_common.relay import OutboxRelay
from gpusched_common.runtime import Runtime, running
from gpusched_common.store import enqueue
from gpusched_common.topics import NODE_COMMAND_PARTITIONS, NODES_COMMANDS, NODES_REPORTS, agent_group

from services.node_agent import app
from services.node_agent.fleet import fleet_node_ids
from tests.integration.kafka_helpers import read_to_end
from tests.integration.test_agent_broker import of, reports, start_job


OWN_COMMANDS_ONLY = app.own_commands_only


def delivered_to(monkeypatch, into: list[Incoming]) -> None:
    """Record every command the agent's consumer hands to its handler, before the agent looks at it."""
    def recording(node_ids, handle: Callable) -> Callable:
        inner = OWN_COMMANDS_ONLY(node_ids, handle)

        async def on_command(message: Incoming) -> None:
            into.append(message)
            await inner(message)

        return on_command

    monkeypatch.setattr(app, "own_commands_only", recording)


def assigned(runtime: Runtime) -> set[TopicPartition]:
    (subscriber,) = runtime.broker._gpusched_subscribers  # type: ignore[attr-defined]
    return subscriber.consumer.assignment()


def nodes_on(partition: int, count: int, *, other_than: str, n: int) -> list[str]:
    """``n`` node ids, not ``other_than``, whose commands are on ``partition`` (of ``count``)."""
    found = (f"other-{i}" for i in range(100_000) if partition_for(f"other-{i}", count) == partition)
    return [node for node, _ in zip((f for f in found if f != other_than), range(n))]


def nodes_off(partitions: set[int], count: int, n: int) -> list[str]:
    """``n`` node ids on ``n`` different partitions, none of ``partitions``."""
    found: dict[int, str] = {}
    for i in range(100_000):
        p = partition_for(f"elsewhere-{i}", count)
        if p not in partitions and p not in found:
            found[p] = f"elsewhere-{i}"
        if len(found) == n:
            return list(found.values())
    raise AssertionError("not enough partitions")


async def send_through_outbox(settings, commands: list[tuple[ev.Payload, str]]) -> None:
    """Node commands as placement sends them: its outbox, published by its relay."""
    pool = await create_pool(settings.database_url)
    broker = build_broker(settings, "test-placement")
    await broker.connect()
    try:
        async with pool.acquire() as conn:
            for payload, node_id in commands:
                envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{node_id}",
                                            occurred_at=datetime.now(timezone.utc), producer="placement")
                await enqueue(conn, producer="placement", topic=NODES_COMMANDS.name, key=node_id, envelopes=[envelope])
        relay = OutboxRelay(pool, broker, "placement", poll_interval_s=1.0)
        while await relay.publish_pending():
            pass
    finally:
        await broker.stop()
        await pool.close()


async def send_published(settings, payload: ev.Payload, node_id: str) -> None:
    """A node command sent with ``messaging.publish`` (every other producer of gpusched)."""
    broker = build_broker(settings, "test-sender")
    await broker.connect()
    try:
        envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{node_id}",
                                    occurred_at=datetime.now(timezone.utc), producer="test")
        await publish(broker, NODES_COMMANDS.name, node_id, envelope.model_dump_json().encode(),
                      {"event-type": payload.TYPE})
    finally:
        await broker.stop()


async def committed_offsets(settings, group: str, until: Callable[[dict[int, int]], bool],
                            timeout_s: float = 15.0) -> tuple[dict[int, int], dict[int, int]]:
    """The command topic's end offsets and ``group``'s committed ones, once ``until`` holds of the latter."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        ends, committed = await group_backlog({"bootstrap_servers": settings.kafka_bootstrap}, NODES_COMMANDS.name,
                                              group)
        if until(committed) or asyncio.get_running_loop().time() > deadline:
            return ends, committed
        await asyncio.sleep(0.2)


async def test_an_agent_reads_only_its_partition_runs_its_commands_and_resumes_where_its_group_committed(
        settings, make_agent_settings, monkeypatch):
    count = await partition_count({"bootstrap_servers": settings.kafka_bootstrap}, NODES_COMMANDS.name)
    assert count == NODE_COMMAND_PARTITIONS  # create_topics gives the command topic its own count
    assert await partition_count({"bootstrap_servers": settings.kafka_bootstrap}, NODES_REPORTS.name) == 3
    node = "node-p"
    mine = partition_for(node, count)
    neighbours = nodes_on(mine, count, other_than=node, n=2)  # on the agent's partition
    strangers = nodes_off({mine}, count, n=4)  # each on a partition of its own
    agent_settings = make_agent_settings(node_id=node, heartbeat_interval_s=60.0, telemetry_interval_s=60.0)

    first: list[Incoming] = []
    delivered_to(monkeypatch, first)
    setup, _ = app.agent_setup(agent_settings)
    async with running("node-agent-p", agent_settings, setup, uses_database=False) as runtime:
        assert assigned(runtime) == {TopicPartition(NODES_COMMANDS.name, mine)}
        others = [(start_job(f"for-{other}", other, "true"), other) for other in [*strangers, *neighbours]]
        await send_through_outbox(settings, [*others, (start_job("mine-1", node, "true"), node)])
        await send_published(settings, start_job("mine-2", node, "true"), node)
        found = await reports(settings, 3, until=lambda f: of(f, "JobExitReported", "mine-2"))
        assert [(m.partition, m.key, m.offset) for m in first] == [(mine, key, offset) for offset, key in
                                                                 enumerate([*neighbours, node, node])]
        ends, committed = await committed_offsets(settings, agent_group(node), until=lambda c: c.get(mine) == 4)
    # the group committed its own partition's end (under the group, though assigned by hand), nothing else
    assert (ends[mine], committed) == (4, {mine: 4})
    # nothing of the others' ran here; its own did, once each
    assert {r["job_id"] for r in of(found, "JobStartReported")} == {"mine-1", "mine-2"}
    # every command is on the partition our partitioner names, whoever published it (relay or publish)
    on_topic = await read_to_end(settings.kafka_bootstrap, NODES_COMMANDS.name)
    assert len(on_topic) == 8
    assert all(r.partition == partition_for(r.key.decode(), count) for r in on_topic)

    await send_published(settings, start_job("mine-3", node, "true"), node)  # while the agent is down
    again: list[Incoming] = []
    delivered_to(monkeypatch, again)
    setup, _ = app.agent_setup(agent_settings)
    async with running("node-agent-p", agent_settings, setup, uses_database=False) as runtime:
        assert assigned(runtime) == {TopicPartition(NODES_COMMANDS.name, mine)}
        found = await reports(settings, 6, until=lambda f: of(f, "JobExitReported", "mine-3"))
    assert [(m.partition, m.key, m.offset) for m in again] == [(mine, node, 4)]  # from where it was, no earlier
    assert [r["job_id"] for r in of(found, "JobStartReported")].count("mine-1") == 1


async def test_a_fleet_reads_the_partitions_its_nodes_hash_to(settings, make_agent_settings, monkeypatch):
    count = await partition_count({"bootstrap_servers": settings.kafka_bootstrap}, NODES_COMMANDS.name)
    nodes = fleet_node_ids("sim", 20)
    theirs = set(partitions_for(nodes, count))
    assert 1 < len(theirs) < count
    strangers = nodes_off(theirs, count, n=3)
    fleet_settings = make_agent_settings(node_id="sim", simulated_nodes=20, telemetry_interval_s=60.0,
                                         heartbeat_interval_s=60.0)
    delivered: list[Incoming] = []
    delivered_to(monkeypatch, delivered)
    setup, _ = app.agent_setup(fleet_settings)
    async with running("node-agent-fleet", fleet_settings, setup, uses_database=False) as runtime:
        assert assigned(runtime) == {TopicPartition(NODES_COMMANDS.name, p) for p in theirs}
        await send_through_outbox(settings, [*((start_job(f"for-{s}", s, "true"), s) for s in strangers),
                                             (start_job("on-7", "sim-007", "true"), "sim-007"),
                                             (start_job("on-13", "sim-013", "true"), "sim-013")])
        found = await reports(settings, 24, until=lambda f: of(f, "JobExitReported", "on-7")
                              and of(f, "JobExitReported", "on-13"))
    assert {(m.key, m.partition) for m in delivered} == {(n, partition_for(n, count)) for n in ("sim-007", "sim-013")}
    assert {r["job_id"] for r in of(found, "JobStartReported")} == {"on-7", "on-13"}
