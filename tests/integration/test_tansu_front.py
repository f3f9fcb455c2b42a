"""The Tansu front holds a fetch the way Apache Kafka does (`infra/fetch_hold.py`): a fetch waiting at the
broker is answered when a record for it comes, not when its wait runs out; an idle consumer fetches about
once per wait. The first test runs on each broker, as the reference behaviour."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gpusched_common.infra import fetch_hold, tansu_front
from gpusched_common.infra.brokers import _start_tansu
from gpusched_common.infra.processes import free_port, stop_pid
from gpusched_common.kafka_admin import create_topics
from gpusched_common.topics import JOBS_EVENTS

LONG_WAIT_MS = 30_000  # a record must arrive well before this: half of it is the test's limit
PARTITIONS = [TopicPartition(JOBS_EVENTS.name, p) for p in range(3)]  # the `topics` fixture makes 3


async def _consumer(bootstrap: str, wait_ms: int = LONG_WAIT_MS) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=wait_ms,
                                request_timeout_ms=wait_ms + 30_000, auto_offset_reset="earliest")
    await consumer.start()
    consumer.assign(PARTITIONS)
    for tp in PARTITIONS:
        await consumer.position(tp)
    return consumer


async def _next(consumer: AIOKafkaConsumer) -> bytes:
    return (await asyncio.wait_for(consumer.getone(), LONG_WAIT_MS / 2000)).value


async def test_a_waiting_fetch_is_answered_when_its_record_comes(running_broker, topics):
    consumer = await _consumer(topics)
    producer = AIOKafkaProducer(bootstrap_servers=topics)
    await producer.start()
    try:
        for i in range(3):
            got = asyncio.ensure_future(_next(consumer))
            await asyncio.sleep(0.3)  # the consumer's fetch is waiting at the broker by now
            await producer.send_and_wait(JOBS_EVENTS.name, f"r{i}".encode(), partition=i)
            assert await got == f"r{i}".encode()
    finally:
        await producer.stop()
        await consumer.stop()


async def test_a_record_for_a_partition_the_held_fetch_left_out_answers_it(running_broker, topics):
    """aiokafka leaves a partition out of its next fetch while it still holds that partition's last answer
    (until the consumer asks for a record again, or for good when that takes over 100 ms): a record for it
    then waits for the fetch that left it out. Apache Kafka holds that fetch for its whole wait; the front
    answers it (empty) as soon as a partition this connection fetched before is written to, and the
    client's next fetch asks for it."""
    if running_broker.kind != "tansu":
        pytest.skip("Apache Kafka answers the fetch that left the partition out when its wait runs out")
    consumer = await _consumer(topics)
    producer = AIOKafkaProducer(bootstrap_servers=topics)
    await producer.start()
    try:
        for i in range(4):
            await asyncio.sleep(0.3)  # aiokafka's next fetch, without partition 0, is waiting at the broker
            await producer.send_and_wait(JOBS_EVENTS.name, f"again{i}".encode(), partition=0)
            assert await _next(consumer) == f"again{i}".encode()
    finally:
        await producer.stop()
        await consumer.stop()


async def test_an_idle_consumer_fetches_about_once_per_wait_and_leaves_nothing_behind(tmp_path, broker_kind,
                                                                                        monkeypatch):
    if broker_kind != "tansu":
        pytest.skip("the front runs before Tansu only")
    backend, port = free_port(), free_port()
    pid = _start_tansu(tmp_path, backend, port)
    front = tansu_front.Front(backend)
    serving = asyncio.ensure_future(tansu_front.serve(port, backend, front))  # in this process: count its fetches
    fetches: list[tuple] = []
    original = fetch_hold.Link._fetch

    async def counted(self, frame, fetch):  # noqa: ANN001, ANN202
        fetches.append(fetch.partitions)
        return await original(self, frame, fetch)

    monkeypatch.setattr(fetch_hold.Link, "_fetch", counted)
    try:
        bootstrap = f"127.0.0.1:{port}"
        await create_topics(bootstrap, partitions=3)
        consumer = await _consumer(bootstrap, wait_ms=1000)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(JOBS_EVENTS.name, b"first", partition=1)
            assert await _next(consumer) == b"first"
            before = len(fetches)
            got = asyncio.ensure_future(_next(consumer))
            await asyncio.sleep(3.0)  # idle: about 3 fetches at 1 s each (60 if the front polled every 50 ms)
            idle = len(fetches) - before
            await producer.send_and_wait(JOBS_EVENTS.name, b"second", partition=2)
            assert await got == b"second"
        finally:
            await producer.stop()
            await consumer.stop()
        assert 2 <= idle <= 6, idle
        await asyncio.sleep(0.1)  # the front notices the closed connection
        assert not front.produced._waiters, "a closed connection left its held fetch registered"
    finally:
        serving.cancel()
        stop_pid(pid)
