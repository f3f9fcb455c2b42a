"""The partition a key is published to (``gpusched_common.partitioning``): the one aiokafka's default
partitioner picks, which every gpusched producer uses (issue 16: an agent reads only the partitions its
nodes hash to, so the two must agree on every key and every partition count), and the Java client's."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from gpusched_common.partitioning import follow_partition_count, partition_for, partitions_for

from services.node_agent.fleet import fleet_node_ids

RNG = random.Random(16)
KEYS = [*fleet_node_ids("sim", 1000), *fleet_node_ids("fleet7", 250), "node-1", "gpu-a100-17.rack3.example", "",
        "ü-ñøðé-名前", *("".join(chr(RNG.randrange(33, 0x2FFF)) for _ in range(RNG.randrange(1, 40))) for _ in range(300))]
COUNTS = [1, 2, 3, 6, 7, 16, 31, 64, 100, 128, 1000]


@pytest.mark.parametrize("count", COUNTS)
def test_a_key_lands_where_aiokafkas_default_partitioner_puts_it(count):
    partitioner = DefaultPartitioner()
    everything = list(range(count))
    for key in KEYS:
        # the producer passes every partition and the available ones; a keyed message ignores availability
        available = RNG.sample(everything, RNG.randrange(1, count + 1))
        assert partition_for(key, count) == partitioner(key.encode(), everything, available), (key, count)


@pytest.mark.parametrize("key, java_murmur2", [  # the Java client's own test vectors (UtilsTest.testMurmur2)
    ("21", -973932308), ("foobar", -790332482), ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829), ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
])
def test_a_key_lands_where_the_java_client_puts_it(key, java_murmur2):
    for count in COUNTS:  # Java: Utils.toPositive(Utils.murmur2(key)) % numPartitions
        assert partition_for(key, count) == (java_murmur2 & 0x7FFFFFFF) % count


def test_a_thousand_nodes_spread_over_the_command_topics_64_partitions():
    nodes = fleet_node_ids("node", 1000)
    per_partition = [sum(partition_for(n, 64) == p for n in nodes) for p in range(64)]
    assert partitions_for(nodes, 64) == tuple(range(64))
    assert 5 <= min(per_partition) and max(per_partition) <= 30  # ~16 nodes' commands each, not 1,000


def test_a_fleets_partitions_are_its_nodes_partitions_once_each_in_order():
    nodes = fleet_node_ids("sim", 20)
    assert partitions_for(nodes, 64) == tuple(sorted({partition_for(n, 64) for n in nodes}))
    assert partitions_for(["node-1"], 64) == (partition_for("node-1", 64),)


def test_a_topic_has_at_least_one_partition():
    with pytest.raises(ValueError):
        partition_for("n1", 0)


class FakeConsumer:
    """The parts of an aiokafka consumer ``follow_partition_count`` uses: the client's cached metadata."""

    def __init__(self, topic: str, count: int, assigned: tuple[int, ...]) -> None:
        self.counts = {topic: count}
        self._client = SimpleNamespace(cluster=SimpleNamespace(partitions_for_topic=self.partitions_for_topic))
        self.assigned = [TopicPartition(topic, p) for p in assigned]

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self.counts.get(topic)
        return None if count is None else set(range(count))

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = list(partitions)


async def test_a_reader_follows_its_keys_when_the_topics_partition_count_changes():
    nodes = fleet_node_ids("sim", 5)
    consumer = FakeConsumer("commands", 8, partitions_for(nodes, 8))
    follow = asyncio.create_task(follow_partition_count(SimpleNamespace(consumer=consumer), "commands", nodes, 8,
                                                        interval_s=0.01))
    try:
        await asyncio.sleep(0.05)
        assert sorted(tp.partition for tp in consumer.assigned) == list(partitions_for(nodes, 8))  # unchanged
        del consumer.counts["commands"]  # the topic gone for a while (a broker that lost its data)
        await asyncio.sleep(0.05)
        assert sorted(tp.partition for tp in consumer.assigned) == list(partitions_for(nodes, 8))
        consumer.counts["commands"] = 64  # created again with another count, or partitions added
        for _ in range(100):
            await asyncio.sleep(0.01)
            if sorted(tp.partition for tp in consumer.assigned) == list(partitions_for(nodes, 64)):
                break
        assert sorted(tp.partition for tp in consumer.assigned) == list(partitions_for(nodes, 64))
        assert {tp.topic for tp in consumer.assigned} == {"commands"}
    finally:
        follow.cancel()
