"""Reading what landed on a topic, for assertions."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord
from gpusched_common.kafka_admin import read_to_end as admin_read_to_end


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
    """A topic of the test's own; both brokers need it created first (Tansu would acknowledge a produce to
    it and keep nothing, Apache Kafka as configured here refuses: see tests/integration/test_broker_differences.py)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def read_to_end(bootstrap: str, topic: str, timeout_s: float = 15.0) -> list[ConsumerRecord]:
    """Every record on `topic` up to its end offsets as they are now (no waiting for more)."""
    return await admin_read_to_end({"bootstrap_servers": bootstrap}, topic, limit_s=timeout_s)

