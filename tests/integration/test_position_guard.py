"""A consumer that outlives its broker's data (issue 15): the position guard of every service process.

Tansu keeps nothing across a restart, and a consumer carries its old position into the new, empty log. By
the time anyone looks, the new log may well have grown past that position (the relay publishes again what
it published recently; producers carry on), so nothing in the offsets shows it: the broker's cluster id
does (`gpusched_common.incarnation`). Apache Kafka keeps its data and its cluster id across a restart, and
the guard leaves its consumers where they are.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from gpusched_common.incarnation import Incarnation, cluster_id
from gpusched_common.infra.brokers import RunningBroker, restart_broker
from gpusched_common.messaging import guard_positions

from tests.integration.kafka_helpers import create_topic

TOPIC = "guarded"


async def _produce(bootstrap: str, values: list[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    await asyncio.wait_for(producer.start(), 30)
    try:
        for value in values:
            await asyncio.wait_for(producer.send_and_wait(TOPIC, value.encode(), partition=0), 30)
    finally:
        await producer.stop()


async def _read_until(consumer: AIOKafkaConsumer, got: list[str], done, timeout_s: float = 30) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not done(got):
        assert asyncio.get_running_loop().time() < deadline, f"read only {got}"
        for records in (await consumer.getmany(timeout_ms=200)).values():
            got.extend(r.value.decode() for r in records)


async def test_a_consumer_whose_broker_lost_its_data_reads_the_new_log_from_its_start(running_broker: RunningBroker):
    bootstrap = running_broker.bootstrap
    await create_topic(bootstrap, TOPIC)
    await _produce(bootstrap, [f"old-{i}" for i in range(8)])
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        got: list[str] = []
        await _read_until(consumer, got, lambda g: len(g) == 8)
        guarded = SimpleNamespace(_gpusched_subscribers=[SimpleNamespace(consumer=consumer)])
        seen = Incarnation()
        seen.known = await cluster_id(consumer._client)
        before = seen.known

        restart_broker(running_broker)
        if not running_broker.keeps_data_across_restart:
            await create_topic(bootstrap, TOPIC)
        await _produce(bootstrap, [f"new-{i}" for i in range(12)])  # the new log passes the old position, 8
        after = await cluster_id(consumer._client)
        assert (after == before) is running_broker.keeps_data_across_restart  # Tansu: a new cluster, kept nothing
        guard = asyncio.create_task(guard_positions(guarded, interval_s=0.1, seen=seen))
        try:
            await _read_until(consumer, got, lambda g: {f"new-{i}" for i in range(12)} <= set(g))
            if running_broker.keeps_data_across_restart:
                await _produce(bootstrap, ["later"])  # a guard tick or more later: still no reset
                await _read_until(consumer, got, lambda g: "later" in g)
        finally:
            guard.cancel()
        assert got[:8] == [f"old-{i}" for i in range(8)]
        if running_broker.keeps_data_across_restart:
            assert got[8:] == [f"new-{i}" for i in range(12)] + ["later"]  # read on from where it was
            assert not seen.resetting(asyncio.get_running_loop().time())
    finally:
        await consumer.stop()


async def test_a_partition_assigned_again_after_a_rejoin_is_read_from_its_start_again():
    """After the broker lost its data the group rejoins, and the rejoin may fetch an old offset that a batch
    in flight committed to the new broker: within the guard's window each new generation's partitions are
    read from their start again (before, only the first assignment was, and the consumer skipped the new
    log's first records: submissions the store never recorded)."""
    sought: list[tuple[int, str]] = []
    coordinator = SimpleNamespace(generation=5)

    class Consumer:
        _coordinator = coordinator
        _client = None

        def assignment(self) -> set[str]:
            return {"p0"}

        async def seek_to_beginning(self, tp: str) -> None:
            sought.append((coordinator.generation, tp))

        def highwater(self, tp: str) -> int:
            return 40  # the new log has passed the old position: only the generation tells

        async def position(self, tp: str) -> int:
            return 31

    guarded = SimpleNamespace(_gpusched_subscribers=[SimpleNamespace(consumer=Consumer())])
    seen = Incarnation(known="new-cluster", changed_at=asyncio.get_running_loop().time())  # just noticed
    guard = asyncio.create_task(guard_positions(guarded, interval_s=0.01, seen=seen))
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while len(sought) < 1:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        coordinator.generation = 6  # the group rebalanced
        while len(sought) < 2:
            assert asyncio.get_running_loop().time() < deadline, sought
            await asyncio.sleep(0.01)
    finally:
        guard.cancel()
    assert sought == [(5, "p0"), (6, "p0")]
