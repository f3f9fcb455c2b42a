"""Reading what landed on a topic, for assertions."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord


async def read_topic(bootstrap: str, topic: str, *, expect: int, timeout_s: float = 15.0) -> list[ConsumerRecord]:
    """Every record on `topic` from the start, waiting until at least `expect` arrived (or the timeout)."""
    # no group: the reader takes every partition itself and skips the group join
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(records) < expect and asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for recs in batch.values():
                records.extend(recs)
        return records
    finally:
        await consumer.stop()


async def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    """A topic of the test's own; both brokers need it created first (Tansu would also create it on the
    first produce, Apache Kafka as configured here refuses: see tests/integration/test_broker_differences.py)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def read_to_end(bootstrap: str, topic: str, timeout_s: float = 15.0) -> list[ConsumerRecord]:
    """Every record on `topic` up to its end offsets as they are now (no waiting for more)."""
    from aiokafka import TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in (await consumer._client.fetch_all_metadata()).partitions_for_topic(topic) or ()]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        records: list[ConsumerRecord] = []
        deadline = asyncio.get_running_loop().time() + timeout_s
        while [p for p in parts if await consumer.position(p) < ends[p]]:
            assert asyncio.get_running_loop().time() < deadline, f"could not read {topic} to its end"
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                records.extend(r for r in recs if r.offset < ends[TopicPartition(r.topic, r.partition)])
        return records
    finally:
        await consumer.stop()
