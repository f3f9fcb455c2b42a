"""Which partition a key's messages are on, as gpusched's producers choose it, so that a consumer can read
only the partitions its keys hash to (the node agents and the command topic: issue 16).

Every gpusched producer is aiokafka's (faststream's ``KafkaBroker.publish`` and the outbox relay hand it a
key and no partition), and aiokafka's default partitioner is the Java client's: murmur2 of the key's bytes,
made positive, modulo the topic's partition count. The count is the topic's own, read from the broker: it
is set when the topic is created (``kafka_admin.create_topics``), and adding partitions to a topic later
moves keys to other partitions (``follow_partition_count`` then moves the readers after them, but a
producer and a reader may disagree until both have seen the new count).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable

from aiokafka import TopicPartition
from aiokafka.partitioner import murmur2

from gpusched_common.kafka_admin import partition_count

log = logging.getLogger(__name__)


def partition_for(key: str, partitions: int) -> int:
    """The partition of a topic of ``partitions`` partitions that a message keyed ``key`` is published to."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions  # the key's bytes as `messaging.publish` sends them


def partitions_for(keys: Iterable[str], partitions: int) -> tuple[int, ...]:
    """The partitions messages keyed by any of ``keys`` are published to, in order."""
    return tuple(sorted({partition_for(key, partitions) for key in keys}))


async def wait_for_partition_count(options: dict, topic: str, *, max_delay_s: float = 5.0) -> int:
    """``topic``'s partition count from the broker's metadata, waiting while the broker is not up or the topic
    does not exist yet (a reader never creates it: a topic made by anyone but ``create_topics`` would have
    another count)."""
    delay = 0.2
    while True:
        try:
            count = await partition_count(options, topic)
            why = "it does not exist yet (`gpusched create-topics` creates it)"
        except Exception as exc:  # noqa: BLE001 - the broker not up yet: ask again
            count, why = None, f"the broker did not answer ({exc})"
        if count:
            return count
        log.warning("cannot read %s's partition count: %s; asking again in %.1fs", topic, why, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay_s)


async def follow_partition_count(subscriber: object, topic: str, keys: Collection[str], count: int,
                                 interval_s: float = 10.0) -> None:
    """Keep a consumer with partitions assigned by hand (``messaging.subscribe(partitions=...)``) on the
    partitions ``keys`` hash to when ``topic``'s partition count changes from ``count``. Reads the metadata
    the consumer's client keeps anyway (refreshed every ``metadata_max_age_ms``, 5 minutes by default, and on
    errors), so watching costs the broker nothing."""
    while True:
        await asyncio.sleep(interval_s)
        consumer = getattr(subscriber, "consumer", None)
        if consumer is None:
            continue
        known = consumer._client.cluster.partitions_for_topic(topic)
        if not known or len(known) == count:
            continue  # a topic gone for now (a broker that lost its data) keeps its readers where they are
        wanted = partitions_for(keys, len(known))
        log.error("%s has %d partitions now, not %d: its keys moved; reading partition(s) %s instead of %s",
                  topic, len(known), count, list(wanted), sorted(tp.partition for tp in consumer.assignment()))
        consumer.assign([TopicPartition(topic, p) for p in wanted])
        count = len(known)
