"""A record for the partition a consumer has just handled is fetched at once, on either broker (issue 16).

aiokafka keeps a partition out of its next fetch while it still holds records of it the consumer has not
taken (with ``getone``, until the consumer asks again after the last one), and by default only for 100 ms
(``prefetch_backoff``): a handler that takes longer lets the fetcher send the next fetch without that
partition, and Apache Kafka holds that fetch for its whole wait unless a record comes for a partition in
it. A record for the handled partition then waited for up to ``fetch_max_wait_ms`` (500 ms in production)
on a quiet topic. Our consumers hold the next fetch until the consumer has taken what it was given
(``messaging.PromptConsumer``). The fetch wait here is 30 s, so the record is either prompt or 30 s late:
the test's limit is a third of that, and no timing is measured."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaProducer

from gpusched_common.messaging import Incoming, build_broker, subscribe
from gpusched_common.settings import Settings
from gpusched_common.topics import JOBS_EVENTS

WAIT_MS = 30_000  # each fetch's wait at the broker
LIMIT_S = 10.0  # the record comes well before a fetch that left its partition out would be answered
JOIN_LIMIT_S = 60.0  # the first record: the consumer joins its group first
BROKER_SKIP = {"tansu": "Tansu answers a waiting fetch only when its wait runs out, records or not: with a 30 s "
                        "wait every record is late (the stack's consumers wait 50 ms there)"}


async def _slow_then_prompt(topics: str, idempotence: bool, by_key: bool) -> None:
    settings = Settings(kafka_bootstrap=topics, kafka_fetch_max_wait_ms=WAIT_MS, kafka_idempotence=idempotence,
                        kafka_session_timeout_ms=6000, consumer_batch_wait_ms=5)
    broker = build_broker(settings, "prefetch-test")
    seen: asyncio.Queue[bytes] = asyncio.Queue()
    slow_done = asyncio.Event()

    async def handler(incoming: Incoming) -> None:
        seen.put_nowait(incoming.value)
        if incoming.value.startswith(b"slow"):
            await asyncio.sleep(0.5)  # longer than aiokafka's 100 ms prefetch backoff
            slow_done.set()

    subscribe(broker, topic=JOBS_EVENTS.name, group_id=f"prefetch-{by_key}", service="test", settings=settings,
              handler=handler, by_key=by_key)
    producer = AIOKafkaProducer(bootstrap_servers=topics)
    await producer.start()
    await broker.start()
    try:
        await producer.send_and_wait(JOBS_EVENTS.name, b"slow-0", key=b"a", partition=0)
        assert await asyncio.wait_for(seen.get(), JOIN_LIMIT_S) == b"slow-0"
        if by_key:  # a batch consumer: records come for the partition while its handler is busy
            await producer.send_and_wait(JOBS_EVENTS.name, b"busy", key=b"a", partition=0)
        await asyncio.wait_for(slow_done.wait(), LIMIT_S)
        if by_key:
            assert await asyncio.wait_for(seen.get(), LIMIT_S) == b"busy"
        for i in range(3):
            await producer.send_and_wait(JOBS_EVENTS.name, f"next-{i}".encode(), key=b"a", partition=0)
            assert await asyncio.wait_for(seen.get(), LIMIT_S) == f"next-{i}".encode()
    finally:
        await broker.stop()
        await producer.stop()


async def test_a_record_for_the_partition_just_handled_one_by_one_comes_at_once(running_broker, topics):
    await _slow_then_prompt(topics, running_broker.idempotence, by_key=False)


async def test_a_record_for_the_partition_a_batch_was_taken_from_comes_at_once(running_broker, topics):
    await _slow_then_prompt(topics, running_broker.idempotence, by_key=True)
