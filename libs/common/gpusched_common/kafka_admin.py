"""Create the project's topics idempotently (used by `gpusched create-topics`, the local stack and tests)."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CoordinatorLoadInProgressError,
    GroupCoordinatorNotAvailableError,
    KafkaConnectionError,
    TopicAlreadyExistsError,
    for_code,
)

from gpusched_common.topics import ALL_TOPICS, NODE_COMMAND_PARTITIONS, NODES_COMMANDS

# Records up to this size are accepted (Settings.kafka_max_request_bytes). Apache Kafka refuses records
# over ~1 MiB by default, and an oversized submission must reach admission to be rejected with a reason.
DEFAULT_MAX_MESSAGE_BYTES = 2 * 1024 * 1024


class TopicCreationFailed(RuntimeError):
    """The broker refused to create some topics (not authorised, invalid settings, ...)."""


async def _connect(options: dict, timeout_s: float) -> AIOKafkaAdminClient:
    """An admin client, retrying while the broker is not up yet."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(client_id="gpusched-admin", **options)
        try:
            await admin.start()
            return admin
        except KafkaConnectionError:
            await admin.close()
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)


async def create_topics(bootstrap: str, partitions: int, replication: int = 1, *, timeout_s: float = 30.0,
                        client: dict | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                        command_partitions: int = NODE_COMMAND_PARTITIONS) -> list[str]:
    """Create every missing topic, with `partitions` partitions each but the node commands' (`command_partitions`:
    each agent reads only the partitions its nodes hash to, so more partitions carry fewer other nodes'
    commands to each); returns the names created. A topic that exists is left as it is (its partitions
    too: adding some would move keys). `client`: further aiokafka options (the security of
    `kafka_client.client_options`). Raises TopicCreationFailed with the broker's reasons when it refuses
    any (the admin client reports them in the response, not as exceptions)."""
    admin = await _connect({**(client or {}), "bootstrap_servers": bootstrap}, timeout_s)
    try:
        existing = set(await admin.list_topics())
        missing = [t.name for t in ALL_TOPICS if t.name not in existing]
        if not missing:
            return []
        config = {"max.message.bytes": str(max_message_bytes)}
        counts = {NODES_COMMANDS.name: command_partitions}
        response = await admin.create_topics([NewTopic(name, counts.get(name, partitions), replication,
                                                       topic_configs=config) for name in missing])
        refused = {}
        for name, code, *message in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):  # already there: a concurrent creator won
                refused[name] = f"{for_code(code).__name__}{': ' + message[0] if message and message[0] else ''}"
        if refused:
            raise TopicCreationFailed("the broker refused to create " + "; ".join(
                f"{name} ({why})" for name, why in sorted(refused.items())))
        return missing
    finally:
        await admin.close()


async def partition_count(options: dict, topic: str) -> int | None:
    """How many partitions ``topic`` has, by the cluster's metadata (None: no such topic). Asks for every
    topic's metadata: naming the topic could make a broker with auto-creation on create it."""
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(**options)
    try:
        await client.bootstrap()
        cluster = await client.fetch_all_metadata()
        return len(cluster.partitions_for_topic(topic) or ()) or None
    finally:
        await client.close()


async def read_to_end(options: dict, topic: str, *, limit_s: float = 30.0) -> list:
    """Every record on ``topic`` up to its end offsets as they are when called (no group, no waiting for
    more), in partition and offset order; TimeoutError when it cannot be read to its end within ``limit_s``.
    (Asks the cluster's metadata itself: Apache Kafka sends none for topics a client is not subscribed to.)"""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(**options, enable_auto_commit=False)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        parts = [TopicPartition(topic, p) for p in sorted(cluster.partitions_for_topic(topic) or ())]
        if not parts:
            return []
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        records: list = []
        deadline = asyncio.get_running_loop().time() + limit_s
        while [p for p in parts if await consumer.position(p) < ends[p]]:
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"could not read {topic} to its end within {limit_s:.0f} s")
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                records.extend(r for r in recs if r.offset < ends[TopicPartition(r.topic, r.partition)])
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


async def group_backlog(options: dict, topic: str, group: str, *, timeout_s: float = 10.0,
                        ) -> tuple[dict[int, int], dict[int, int]]:
    """``topic``'s end offsets and ``group``'s committed offsets there, by partition (a partition the group
    never committed on is absent from the second), as they are when called."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async with asyncio.timeout(timeout_s):
        consumer = AIOKafkaConsumer(**options, enable_auto_commit=False)
        await consumer.start()
        try:
            cluster = await consumer._client.fetch_all_metadata()
            parts = [TopicPartition(topic, p) for p in sorted(cluster.partitions_for_topic(topic) or ())]
            ends = await consumer.end_offsets(parts) if parts else {}
        finally:
            await consumer.stop()
        admin = await _connect(options, timeout_s)
        try:
            while True:
                try:
                    committed = await admin.list_consumer_group_offsets(group, partitions=parts)
                    break
                except (GroupCoordinatorNotAvailableError, CoordinatorLoadInProgressError):
                    await asyncio.sleep(0.2)  # a broker still electing the group's coordinator: soon
        finally:
            await admin.close()
    return ({tp.partition: offset for tp, offset in ends.items()},
            {tp.partition: meta.offset for tp, meta in committed.items() if meta is not None and meta.offset >= 0})
