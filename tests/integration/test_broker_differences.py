"""What differs between the two brokers gpusched runs on, checked rather than assumed (README: "Tansu and
Apache Kafka"). Every test runs on each broker selected with --broker and asserts that broker's behaviour.

gpusched's code relies on none of these: producers enable idempotence only where the broker has it
(`RunningBroker.idempotence`), topics are created before use (`create_topics`), session timeouts stay
above Kafka's floor, and the store, not the broker, is the memory that survives a restart.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import InvalidSessionTimeoutError, KafkaError, MessageSizeTooLargeError

from gpusched_common.infra.brokers import RunningBroker, restart_broker
from gpusched_common.kafka_admin import create_topics, read_to_end
from gpusched_common.topics import JOBS_EVENTS

from tests.integration.kafka_helpers import read_topic


async def _produce(bootstrap: str, topic: str, values: list[bytes], **options) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, **options)
    await asyncio.wait_for(producer.start(), 30)
    try:
        for value in values:
            await asyncio.wait_for(producer.send_and_wait(topic, value, key=b"k"), 30)
    finally:
        await producer.stop()


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t for t in await admin.list_topics() if not t.startswith("__")}
    finally:
        await admin.close()


async def test_the_idempotent_producer_works_on_apache_kafka_and_is_refused_by_tansu(running_broker, topics):
    if running_broker.kind == "kafka":
        await _produce(topics, JOBS_EVENTS.name, [b"once"], enable_idempotence=True)
        assert [r.value for r in await read_topic(topics, JOBS_EVENTS.name, expect=1)] == [b"once"]
    else:  # Tansu answers InitProducerId with an error
        with pytest.raises(KafkaError):
            await _produce(topics, JOBS_EVENTS.name, [b"once"], enable_idempotence=True)
    assert running_broker.idempotence is (running_broker.kind == "kafka")


async def test_transactions_work_on_apache_kafka_and_are_refused_by_tansu(running_broker, topics):
    producer = AIOKafkaProducer(bootstrap_servers=topics, transactional_id="diff-test", request_timeout_ms=5000)
    if running_broker.kind == "tansu":
        with pytest.raises(KafkaError):
            await asyncio.wait_for(producer.start(), 30)
        await producer.stop()
        return
    await asyncio.wait_for(producer.start(), 30)
    try:
        async with producer.transaction():
            await producer.send_and_wait(JOBS_EVENTS.name, b"in a transaction", key=b"k")
    finally:
        await producer.stop()
    assert [r.value for r in await read_topic(topics, JOBS_EVENTS.name, expect=1)] == [b"in a transaction"]


async def test_tansu_creates_a_topic_on_first_produce_and_our_apache_kafka_refuses(running_broker: RunningBroker):
    bootstrap = running_broker.bootstrap
    if running_broker.kind == "tansu":
        await _produce(bootstrap, "made.on.first.use", [b"x"])
        assert "made.on.first.use" in await _topics(bootstrap)
    else:  # auto.create.topics.enable=false, as a production cluster is run: gpusched creates its topics
        with pytest.raises(KafkaError):
            await _produce(bootstrap, "made.on.first.use", [b"x"])
        assert "made.on.first.use" not in await _topics(bootstrap)


async def test_apache_kafka_refuses_a_session_timeout_below_its_floor_and_tansu_has_none(running_broker, topics):
    await _produce(topics, JOBS_EVENTS.name, [b"r1"])
    consumer = AIOKafkaConsumer(JOBS_EVENTS.name, bootstrap_servers=topics, group_id="short-session",
                                session_timeout_ms=200, heartbeat_interval_ms=50, auto_offset_reset="earliest")
    try:
        if running_broker.kind == "kafka":  # group.min.session.timeout.ms (500 here, 6000 by default)
            with pytest.raises(InvalidSessionTimeoutError):
                await asyncio.wait_for(consumer.start(), 30)
        else:
            await consumer.start()
            assert (await asyncio.wait_for(consumer.getone(), 15)).value == b"r1"
    finally:
        await consumer.stop()


async def test_apache_kafka_answers_a_waiting_fetch_when_a_record_comes_and_tansu_when_its_wait_ends(
        running_broker, topics):
    """Why the local Tansu stack's consumers wait 50 ms and production's 500 (settings.kafka_fetch_max_wait_ms),
    and why the untaken-records hold is set per broker (messaging.PromptConsumer). The fetch waits 6 s and the
    record comes 1 s after it is sent: Kafka answers at once, Tansu on its own schedule (measured: 2 s after the
    record here, 1.5-4 s after it with other timings; a fetch nothing came for, at the wait's end)."""
    wait_s = 6.0
    partition = TopicPartition(JOBS_EVENTS.name, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=topics, fetch_max_wait_ms=int(wait_s * 1000),
                                request_timeout_ms=30_000, auto_offset_reset="latest")
    await consumer.start()
    try:
        consumer.assign([partition])
        await consumer.position(partition)  # the consumer's fetches start from here
        got = asyncio.ensure_future(consumer.getone())
        await asyncio.sleep(1.0)  # its fetch is waiting at the broker
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await _produce(topics, JOBS_EVENTS.name, [b"late?"], partitioner=lambda *_: 0)
        assert (await asyncio.wait_for(got, 3 * wait_s)).value == b"late?"
        after = loop.time() - sent
        if running_broker.kind == "kafka":
            assert after < wait_s / 10, after
        else:
            assert after > wait_s / 10, after
    finally:
        await consumer.stop()


async def test_a_restart_keeps_records_and_offsets_on_apache_kafka_and_loses_everything_on_tansu(
        running_broker: RunningBroker, topics):
    await _produce(topics, JOBS_EVENTS.name, [f"r{i}".encode() for i in range(10)])
    partitions = [TopicPartition(JOBS_EVENTS.name, p) for p in range(3)]  # the `topics` fixture makes 3
    consumer = AIOKafkaConsumer(bootstrap_servers=topics, group_id="restart-test", enable_auto_commit=False)
    await consumer.start()
    consumer.assign(partitions)
    await consumer.commit({tp: 1 for tp in partitions})
    await consumer.stop()

    restart_broker(running_broker)

    if running_broker.kind == "tansu":  # its front created the topics again as they were; they are empty
        admin = AIOKafkaAdminClient(bootstrap_servers=topics)
        await admin.start()
        try:
            described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics([JOBS_EVENTS.name])}
        finally:
            await admin.close()
        assert described == {JOBS_EVENTS.name: 3}
        assert await read_to_end({"bootstrap_servers": topics}, JOBS_EVENTS.name) == []
        consumer = AIOKafkaConsumer(bootstrap_servers=topics, group_id="restart-test", enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(partitions)
            assert [await consumer.committed(tp) for tp in partitions] == [None, None, None]
        finally:
            await consumer.stop()
        return
    records = await read_topic(topics, JOBS_EVENTS.name, expect=10)
    assert sorted(r.value for r in records) == sorted(f"r{i}".encode() for i in range(10))
    consumer = AIOKafkaConsumer(bootstrap_servers=topics, group_id="restart-test", enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(partitions)
        # the group's coordinator may still be loading its offsets just after the restart: ask until it answers
        deadline = asyncio.get_running_loop().time() + 60
        while (committed := [await consumer.committed(tp) for tp in partitions]) != [1, 1, 1]:
            assert asyncio.get_running_loop().time() < deadline, committed
            await asyncio.sleep(0.5)
    finally:
        await consumer.stop()


async def test_a_record_over_a_mebibyte_needs_the_topic_limit_gpusched_sets_on_apache_kafka(running_broker):
    """Kafka refuses records over its default ~1 MiB limit; create_topics raises gpusched's topics to
    2 MiB (an oversized submission must reach admission, to be rejected with a reason). Tansu has no
    limit of its own here."""
    from aiokafka.admin import NewTopic

    bootstrap = running_broker.bootstrap
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("default.limit", 1, 1)])
    finally:
        await admin.close()
    await create_topics(bootstrap, partitions=1)
    big = b"x" * (1024 * 1024 + 100)
    options = {"max_request_size": 4 * 1024 * 1024}
    await _produce(bootstrap, JOBS_EVENTS.name, [big], **options)
    if running_broker.kind == "kafka":
        with pytest.raises(MessageSizeTooLargeError):
            await _produce(bootstrap, "default.limit", [big], **options)
    else:
        await _produce(bootstrap, "default.limit", [big], **options)


async def test_tansu_acknowledges_records_for_partitions_it_does_not_have_and_makes_up_topics(tmp_path, broker_kind):
    """Why Tansu runs behind a front (`infra/tansu_front.py`): on its own, a produce to a partition beyond a
    topic's count is acknowledged and kept nowhere, and a client asking for a topic it lacks gets one made
    up with 4 partitions. After a restart, producers that knew the topics (6 partitions) would lose what
    they sent to 4 and 5 until someone recreated the topics, which by then may exist with the wrong count."""
    if broker_kind != "tansu":
        pytest.skip("Apache Kafka refuses a produce to a topic it does not have (auto.create.topics.enable=false)")
    from gpusched_common.infra.brokers import _start_tansu
    from gpusched_common.infra.processes import free_port, stop_pid

    port = free_port()
    pid = _start_tansu(tmp_path, port, port)  # no front
    try:
        bootstrap = f"127.0.0.1:{port}"
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        await producer.start()
        try:
            await create_topics(bootstrap, partitions=2)
            assert await producer.partitions_for(JOBS_EVENTS.name) == {0, 1}
            producer.client.cluster._partitions[JOBS_EVENTS.name][5] = producer.client.cluster._partitions[
                JOBS_EVENTS.name][0]  # as a producer that knew the topic with 6 partitions before a restart
            beyond = await producer.send_and_wait(JOBS_EVENTS.name, b"lost", partition=5)
            assert await producer.partitions_for("never.created") == {0, 1, 2, 3}
        finally:
            await producer.stop()
        assert beyond.offset == 0  # acknowledged
        assert await read_to_end({"bootstrap_servers": bootstrap}, JOBS_EVENTS.name) == []
    finally:
        stop_pid(pid)


async def test_what_a_producer_sends_while_tansu_comes_back_empty_is_kept(running_broker: RunningBroker, topics):
    """Behind its front, a restarted Tansu takes no client in before it has its topics again (as they were),
    so a producer that was connected before the restart sends into the topics, not into nothing: what it
    sends is either refused (and retried) or kept. Apache Kafka keeps its log: the same holds there."""
    producer = AIOKafkaProducer(bootstrap_servers=topics, request_timeout_ms=30000)
    await producer.start()
    try:
        await producer.send_and_wait(JOBS_EVENTS.name, b"before", partition=2)
        restart_broker(running_broker)
        for partition in range(3):
            await asyncio.wait_for(producer.send_and_wait(JOBS_EVENTS.name, f"after-{partition}".encode(),
                                                          partition=partition), 60)
    finally:
        await producer.stop()
    values = sorted(r.value for r in await read_topic(topics, JOBS_EVENTS.name,
                                                         expect=3 if running_broker.kind == "tansu" else 4))
    assert values == sorted(([] if running_broker.kind == "tansu" else [b"before"]) + [b"after-0", b"after-1", b"after-2"])
