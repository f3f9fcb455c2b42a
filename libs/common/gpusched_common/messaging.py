"""Kafka wiring on faststream/aiokafka.

Delivery contract for every consumer built here:
- offsets are committed only after the handler returned, i.e. after its database transaction committed;
- a dependency that is down (database, broker) is retried until it comes back, never dead-lettered;
- any other failure is retried a bounded number of times, then the message goes to the dead-letter topic
  with the error in its headers, and only then is the offset committed;
- a `PoisonMessage` (cannot ever be handled, e.g. not JSON) goes to the dead-letter topic at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from functools import partial

import asyncpg
from aiokafka import AIOKafkaConsumer
from aiokafka import __version__ as aiokafka_version
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaMessage, TopicPartition
from opentelemetry import trace

from gpusched_common.events import Envelope, Payload, parse_payload
from gpusched_common.incarnation import Incarnation, cluster_id
from gpusched_common.kafka_client import broker_security
from gpusched_common.settings import Settings
from gpusched_common.store import ConcurrencyError
from gpusched_common.topics import BACKGROUND_TOPICS, DEADLETTER
from gpusched_common.tracing import context_from_traceparent, tracer

log = logging.getLogger(__name__)

_TRANSIENT = (OSError, ConnectionError, asyncio.TimeoutError, asyncpg.PostgresConnectionError,
              asyncpg.InterfaceError, asyncpg.CannotConnectNowError)
_MAX_TRANSIENT_BACKOFF_S = 5.0
_CONCURRENCY_ATTEMPTS = 20
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # over the largest message the broker is configured to take


class PoisonMessage(ValueError):
    """The message can never be handled; it goes to the dead-letter topic without retries."""


@dataclass(frozen=True)
class Incoming:
    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: dict[str, str]
    # what parse_event made of the value, kept so a batch screened before its transaction is parsed once
    parsed: tuple[Envelope, Payload] | None = field(default=None, compare=False, repr=False)

    @property
    def traceparent(self) -> str | None:
        return self.headers.get("traceparent")


Handler = Callable[[Incoming], Awaitable[None]]


def parse_event(message: Incoming) -> tuple[Envelope, Payload]:
    """The envelope and typed payload of a message; anything unreadable can never be handled, so it is a
    PoisonMessage (dead-lettered at once): not JSON, nested too deep (the parser's recursion limit), an
    unknown type or version, fields that do not validate, a NUL character anywhere (PostgreSQL's text and
    jsonb cannot hold one, and no gpusched message needs one), or larger than MAX_MESSAGE_BYTES."""
    if message.parsed is not None:
        return message.parsed
    if len(message.value) > MAX_MESSAGE_BYTES:
        raise PoisonMessage(f"a message of {len(message.value)} bytes, over {MAX_MESSAGE_BYTES}")
    if b"\x00" in message.value or b"\\u0000" in message.value:
        raise PoisonMessage("unreadable message: a NUL character (never in a gpusched message)")
    try:
        envelope = Envelope.model_validate_json(message.value)
        parsed = envelope, parse_payload(envelope)
    except ValueError as exc:  # pydantic's ValidationError and UnknownEventType are ValueErrors
        raise PoisonMessage(f"unreadable message: {str(exc)[:2000]}") from exc
    object.__setattr__(message, "parsed", parsed)
    return parsed


def poisoned(message: Incoming) -> PoisonMessage | None:
    """Why the message can never be handled (None: it parses)."""
    try:
        parse_event(message)
        return None
    except PoisonMessage as exc:
        return exc


class PromptConsumer(AIOKafkaConsumer):
    """An aiokafka consumer whose next fetch waits until the records of the last one are taken (issue 16).

    aiokafka leaves a partition whose records the consumer has not taken yet out of its next fetch, and
    sends that fetch once those records are 100 ms old (its `prefetch_backoff`); only one fetch per broker
    is in flight. With a handler busier than 100 ms, the fetch left the partition out, and when the
    consumer then took the records and a new one came for that partition, Apache Kafka answered nothing
    until the fetch's wait ran out (it answers a held fetch early only for the partitions in it): up to
    `fetch_max_wait_ms` (500 ms) added to a hop on a quiet topic. Holding the next fetch until the records
    are taken (at most `Settings.kafka_untaken_hold_ms`) costs one fetch's round trip after each batch,
    where the other partitions' records would have been fetched while the handler ran
    (`tests/integration/test_consumer_prefetch.py`)."""

    def __init__(self, *topics: str, untaken_hold_s: float = 0.1, **options: object) -> None:
        super().__init__(*topics, **options)
        self._untaken_hold_s = untaken_hold_s

    async def start(self) -> None:
        await super().start()
        fetcher = getattr(self, "_fetcher", None)
        if not hasattr(fetcher, "_prefetch_backoff"):  # an aiokafka whose fetcher changed: say so, run as it is
            log.warning("aiokafka %s has no prefetch backoff to set: a consumer's records may wait for a fetch "
                        "that left their partition out", aiokafka_version)
            return
        fetcher._prefetch_backoff = self._untaken_hold_s  # no option of the consumer: its fetcher's own


class _Broker(KafkaBroker):
    """faststream's KafkaBroker building its subscribers' consumers as PromptConsumers."""

    def __init__(self, *args: object, untaken_hold_s: float, **options: object) -> None:
        super().__init__(*args, **options)
        self._untaken_hold_s = untaken_hold_s

    async def _connect(self):  # noqa: ANN202 - faststream's consumer builder
        builder = await super()._connect()
        prompt = partial(PromptConsumer, *builder.args, untaken_hold_s=self._untaken_hold_s, **builder.keywords)
        self.config.broker_config.builder = prompt  # what each subscriber builds its consumer with
        return prompt


def build_broker(settings: Settings, client_id: str) -> KafkaBroker:
    return _Broker(
        settings.kafka_bootstrap,
        untaken_hold_s=settings.kafka_untaken_hold_ms / 1000,
        client_id=client_id,
        acks="all",
        enable_idempotence=settings.kafka_idempotence,
        security=broker_security(settings),
        max_request_size=settings.kafka_max_request_bytes,
        linger_ms=1,
        logger=None,
    )


async def publish(broker: KafkaBroker, topic: str, key: str, value: bytes,
                  headers: dict[str, str] | None = None) -> None:
    await broker.publish(value, topic, key=key.encode(), headers=headers or {})


async def _message_itself(msg: KafkaMessage) -> KafkaMessage:
    # Handing the message over as the body avoids faststream's context injection, which resolves
    # `msg: KafkaMessage` parameters in a worker thread for every message.
    return msg


def to_incoming(record) -> Incoming:  # noqa: ANN001 - an aiokafka ConsumerRecord
    return Incoming(
        topic=record.topic, partition=record.partition, offset=record.offset,
        key=record.key.decode(errors="replace") if record.key else None,
        value=record.value or b"", headers={k: v.decode(errors="replace") for k, v in record.headers},
    )


def fetch_wait_ms(settings: Settings, topic: str | None) -> int:
    """How long a consumer of ``topic`` lets the broker hold its fetch (``Settings.kafka_fetch_max_wait_ms``;
    a background topic's consumers at least ``kafka_fetch_max_wait_background_ms``)."""
    if topic in BACKGROUND_TOPICS:
        return max(settings.kafka_fetch_max_wait_ms, settings.kafka_fetch_max_wait_background_ms)
    return settings.kafka_fetch_max_wait_ms


def consumer_options(settings: Settings, group_id: str, topic: str | None = None) -> dict:
    return dict(
        group_id=group_id, ack_policy=AckPolicy.MANUAL, auto_offset_reset="earliest",
        max_partition_fetch_bytes=settings.kafka_fetch_max_bytes, fetch_max_bytes=settings.kafka_fetch_max_bytes,
        fetch_max_wait_ms=fetch_wait_ms(settings, topic), session_timeout_ms=settings.kafka_session_timeout_ms,
        heartbeat_interval_ms=max(100, settings.kafka_session_timeout_ms // 4),
        rebalance_timeout_ms=settings.kafka_session_timeout_ms, decoder=_message_itself,
    )


def track(broker: KafkaBroker, subscriber: object) -> None:
    """Remember a subscriber of ``broker`` for ``guard_positions``."""
    subscribers = getattr(broker, "_gpusched_subscribers", None)
    if subscribers is None:
        subscribers = []
        broker._gpusched_subscribers = subscribers  # type: ignore[attr-defined]
    subscribers.append(subscriber)


async def guard_positions(broker: KafkaBroker, interval_s: float = 2.0, seen: Incarnation | None = None) -> None:
    """Move a consumer back to the start of a partition whose log is not the one its position was in
    (issue 15).

    A broker that lost its data starts every partition again at offset 0, and a consumer may carry its old
    position into the new log: it rejoins and finds the offset it committed from memory just after the
    restart (a batch in flight), or it never lost its assignment. Apache Kafka answers a fetch beyond the
    log's end with OFFSET_OUT_OF_RANGE (the consumer resets itself); Tansu answers it with no records and a
    high watermark below the position, so the consumer would wait there and skip everything written before
    the log reached it again, and once the new log has passed the old position nothing in the offsets tells
    the two apart. So the guard asks the broker's cluster id each time (`gpusched_common.incarnation`): when
    it changed, every partition assigned now or within the next minute is read from its start, again after
    each rebalance in that minute (a rejoin fetches the old offset a batch in flight committed to the new
    broker; what the consumer had already is a duplicate). A position above the partition's high watermark
    (never so while the log lives) does the same for one partition."""
    seen = Incarnation() if seen is None else seen  # the broker this process knew (a test passes its own)
    reset: set[tuple[int, object, object]] = set()  # (consumer, partition, group generation) read from the start
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        consumers = [c for s in list(getattr(broker, "_gpusched_subscribers", ()))
                     if (c := getattr(s, "consumer", None)) is not None]
        if not consumers:
            continue
        try:
            if seen.note(await cluster_id(consumers[0]._client), loop.time()):
                log.error("the broker is a new cluster (id %s): it lost its data; reading every partition from "
                          "its start", seen.known)
                reset.clear()
        except Exception as exc:  # noqa: BLE001 - an outage: ask again next time
            log.debug("position guard: cluster id: %s", exc)
        now = loop.time()
        for consumer in consumers:
            try:
                generation = getattr(getattr(consumer, "_coordinator", None), "generation", None)
                for tp in consumer.assignment():
                    if seen.resetting(now) and (id(consumer), tp, generation) not in reset:
                        await consumer.seek_to_beginning(tp)
                        reset.add((id(consumer), tp, generation))
                        continue
                    high = consumer.highwater(tp)
                    if high is None:
                        continue
                    async with asyncio.timeout(1.0):  # not wait_for: see relay._pump
                        position = await consumer.position(tp)
                    if position > high:
                        log.error("%s[%d]: position %d is beyond the log's end %d (the broker lost its data): "
                                  "reading the partition from its start", tp.topic, tp.partition, position, high)
                        await consumer.seek_to_beginning(tp)
            except Exception as exc:  # noqa: BLE001 - a rebalance or an outage: look again next time
                log.debug("position guard: %s", exc)


def subscribe(broker: KafkaBroker, *, topic: str, group_id: str, service: str, settings: Settings,
              handler: Handler, partitions: Collection[int] | None = None, by_key: bool = False) -> object:
    """Register `handler` for `topic` under the delivery contract in this module's docstring; returns the
    subscriber (its ``consumer`` once started).

    `partitions`: read only these partitions of `topic`, assigned by hand rather than by the group (a node
    agent: the partitions its nodes' commands are on). No group membership, so one reader joining or
    leaving moves no other; the group still keeps the committed offsets, so a restarted reader resumes
    where it was. The topic must exist (it is not created here: its partition count is the point).

    `by_key`: messages are fetched in batches and those of different keys handled concurrently, each key's
    in order (a fleet of simulated nodes: one node's slow start does not hold up the others); the batch's
    offsets are committed once every message of it was handled (or dead-lettered), as for one message."""
    options = consumer_options(settings, group_id, topic)
    if by_key:
        options = {**options, "batch": True, "max_records": settings.consumer_batch_max,
                   "batch_timeout_ms": settings.consumer_batch_wait_ms}
    if partitions is None:
        subscriber = broker.subscriber(topic, **options)
    else:
        subscriber = broker.subscriber(
            partitions=[TopicPartition(topic, p, declare=False) for p in sorted(partitions)], **options)
    track(broker, subscriber)

    async def one(incoming: Incoming) -> None:
        await handle_with_retries(broker, incoming, service=service, settings=settings, handler=handler)

    if by_key:
        @subscriber
        async def on_batch(msg):  # noqa: ANN001 - the decoder hands over the batch's KafkaMessage
            records = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
            await handle_by_key([to_incoming(r) for r in records], one)
            await msg.ack()
    else:
        @subscriber
        async def on_message(msg):  # noqa: ANN001 - the decoder hands over the KafkaMessage itself
            await one(to_incoming(msg.raw_message))
            await msg.ack()

    return subscriber


async def handle_by_key(messages: list[Incoming], handle: Handler) -> None:
    """Handle ``messages``: those of one key one after another, in their order; different keys at once."""
    by_key: dict[str | None, list[Incoming]] = {}
    for message in messages:
        by_key.setdefault(message.key, []).append(message)

    async def in_order(group: list[Incoming]) -> None:
        for message in group:
            await handle(message)

    await asyncio.gather(*(in_order(group) for group in by_key.values()))


def message_span(service: str, incoming: Incoming):  # noqa: ANN201 - a context manager
    return tracer().start_as_current_span(
        f"{service} {incoming.headers.get('event-type', incoming.topic)}",
        context=context_from_traceparent(incoming.traceparent),
        kind=trace.SpanKind.CONSUMER,
        attributes={"messaging.destination": incoming.topic, "messaging.kafka.offset": incoming.offset,
                    "messaging.kafka.partition": incoming.partition, "gpusched.key": incoming.key or ""},
    )


async def handle_with_retries(broker: KafkaBroker, incoming: Incoming, *, service: str, settings: Settings,
                              handler: Handler) -> bool:
    """Handle the message under the delivery contract; False when it was dead-lettered."""
    attempt = 0
    transient_backoff = settings.handler_retry_backoff_s
    while True:
        attempt += 1
        try:
            with message_span(service, incoming):
                await handler(incoming)
            return True
        except PoisonMessage as exc:
            await dead_letter(broker, incoming, service=service, error=exc, attempts=attempt)
            return False
        except _TRANSIENT as exc:
            log.warning("%s: dependency unavailable handling %s@%s (%s); retrying in %.1fs",
                        service, incoming.topic, incoming.offset, exc, transient_backoff)
            await asyncio.sleep(transient_backoff)
            transient_backoff = min(transient_backoff * 2, _MAX_TRANSIENT_BACKOFF_S)
            attempt -= 1  # an outage does not use up the message's attempts
        except ConcurrencyError as exc:
            if attempt >= _CONCURRENCY_ATTEMPTS:
                await dead_letter(broker, incoming, service=service, error=exc, attempts=attempt)
                return False
        except Exception as exc:  # noqa: BLE001 - anything else is retried, then dead-lettered
            log.exception("%s: handler failed on %s@%s (attempt %d)", service, incoming.topic, incoming.offset,
                          attempt)
            if attempt >= settings.handler_max_attempts:
                await dead_letter(broker, incoming, service=service, error=exc, attempts=attempt)
                return False
            await asyncio.sleep(settings.handler_retry_backoff_s * attempt)


async def dead_letter(broker: KafkaBroker, incoming: Incoming, *, service: str, error: BaseException,
                      attempts: int) -> None:
    log.error("%s: dead-lettering %s[%d]@%d: %s", service, incoming.topic, incoming.partition, incoming.offset,
              error)
    headers = dict(incoming.headers)
    headers.update({
        "dlq-error": f"{type(error).__name__}: {error}"[:4000],
        "dlq-source-topic": incoming.topic,
        "dlq-source-partition": str(incoming.partition),
        "dlq-source-offset": str(incoming.offset),
        "dlq-consumer": service,
        "dlq-attempts": str(attempts),
    })
    await publish(broker, DEADLETTER.name, incoming.key or "", incoming.value, headers)
