"""Transactional batch consumption: many messages, one database transaction, one offset commit.

The fast path applies every message of a fetched batch inside one transaction, then runs the batch's
deferred work once (a placement cycle, a tenant's reservation pass) and commits; the offsets are committed
after that. If anything in the batch fails, the transaction rolls back and the batch is replayed one
message at a time under the per-message contract of `messaging` (retries, then dead-letter), so one bad
message costs the batch its speed, never its correctness.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import asyncpg
from faststream.kafka import KafkaBroker

from gpusched_common.db import DATABASE_AWAY
from gpusched_common.messaging import (
    Incoming,
    consumer_options,
    dead_letter,
    handle_with_retries,
    PoisonMessage,
    message_span,
    parse_event,
    poisoned,
    to_incoming,
    track,
)
from gpusched_common import store
from gpusched_common.ids import job_stream
from gpusched_common.store import claim_dead_lettered
from gpusched_common.topics import INBOX_READERS, JOBS_CONTROL, JOBS_EVENTS, JOBS_SUBMITTED
from gpusched_common.settings import Settings

log = logging.getLogger(__name__)

AfterBatch = Callable[[asyncpg.Connection], Awaitable[None]]


class Batch:
    """Work a handler defers to the end of the batch, once per key (e.g. one cycle per batch)."""

    def __init__(self, messages: tuple[Incoming, ...] = ()) -> None:
        self._after: dict[str, AfterBatch] = {}
        self.memo: dict[str, object] = {}  # what a handler keeps for the batch's later messages (its transaction's)
        self.messages = messages  # the whole batch, for a handler that reads ahead (e.g. every sender's key at once)
        self.committed: dict[str, Callable[[], None]] = {}  # what to do once its transaction committed, per key

    def after(self, key: str, work: AfterBatch) -> None:
        self._after.setdefault(key, work)

    def after_commit(self, key: str, done: Callable[[], None]) -> None:
        """``done`` once, after the batch's transaction committed (never if it rolled back): what another
        transaction must see the batch's writes for (e.g. a cycle due later over the jobs it queued)."""
        self.committed.setdefault(key, done)

    async def finish(self, conn: asyncpg.Connection) -> None:
        """Each key's work once, in key order (so concurrent replicas take locks alike); work may defer more
        (e.g. releases that ask for their cohorts' cycles), which runs in its turn among what is left."""
        done: set[str] = set()
        while todo := sorted(self._after.keys() - done):
            done.add(todo[0])
            await self._after[todo[0]](conn)


TxHandler = Callable[[asyncpg.Connection, Incoming, Batch], Awaitable[None]]


# Topics whose messages are keyed by the job whose stream they concern: a batch reads those streams at once.
_JOB_KEYED = frozenset({JOBS_SUBMITTED.name, JOBS_EVENTS.name, JOBS_CONTROL.name})


async def apply_batch(pool: asyncpg.Pool, service: str, messages: list[Incoming], handler: TxHandler) -> None:
    """Apply messages in one transaction; raises (after rollback) if any of them fails. A batch of several
    reads its claims and its jobs' streams in two queries first, and writes its claims in one before it
    commits (``store.BatchReads``)."""
    batch = Batch(tuple(messages))
    async with pool.acquire() as conn, conn.transaction():
        token = None
        if len(messages) > 1:
            event_ids = [m.parsed[0].event_id if m.parsed is not None else store.event_id_of(m.value)
                         for m in messages]
            streams = [s for s in map(_job_stream_of, messages) if s is not None]
            reads = await store.read_for_batch(conn, service, [e for e in event_ids if e is not None], streams)
            token = store.BATCH_READS.set(reads)
        try:
            for message in messages:
                with message_span(service, message):
                    await handler(conn, message, batch)
            await batch.finish(conn)
            if token is not None:
                await store.write_claims(conn, reads)
        finally:
            if token is not None:
                store.BATCH_READS.reset(token)
    for done in batch.committed.values():
        done()


def _job_stream_of(message: Incoming) -> str | None:
    """The job stream a message concerns, for the batch to read at its start: its key on a job-keyed
    topic, else the job a parsed report names (a node's start or exit report, keyed by its node)."""
    if message.topic in _JOB_KEYED:
        return job_stream(message.key) if message.key else None
    job_id = getattr(message.parsed[1], "job_id", None) if message.parsed is not None else None
    return job_stream(job_id) if isinstance(job_id, str) and job_id else None


Screen = Callable[[Incoming], Exception | None]


def subscribe_transactional(broker: KafkaBroker, pool: asyncpg.Pool, *, topic: str, group_id: str, service: str,
                            settings: Settings, handler: TxHandler, screen: Screen | None = poisoned) -> None:
    """``screen``: why a message can never be handled (it is dead-lettered before the batch's transaction,
    so it costs the batch nothing); None: the handler judges every message itself. The outbox relay is
    woken by the commit itself (its LISTEN), only when the batch wrote outbox rows."""
    async def one(message: Incoming) -> None:
        await apply_batch(pool, service, [message], handler)

    wanted = INBOX_READERS.get(topic, {}).get(service)

    subscriber = broker.subscriber(topic, batch=True, max_records=settings.consumer_batch_max,
                                   batch_timeout_ms=settings.consumer_batch_wait_ms,
                                   **consumer_options(settings, group_id, topic))
    track(broker, subscriber)

    @subscriber
    async def on_batch(msg):  # noqa: ANN001 - the decoder hands over the batch's KafkaMessage
        records = msg.raw_message if isinstance(msg.raw_message, tuple) else (msg.raw_message,)
        messages = []
        for message in (to_incoming(r) for r in records):
            if passed_over(message, wanted):
                continue
            poison = screen(message) if screen is not None else None  # dead-lettered at once; the rest batched
            if poison is None:
                messages.append(message)
            else:
                await dead_letter(broker, message, service=service, error=poison, attempts=0)

        async def alone(message: Incoming) -> None:  # retries, then the dead-letter topic
            if not await handle_with_retries(broker, message, service=service, settings=settings, handler=one):
                await remember_dead_lettered(pool, service, message)

        if messages:
            await apply_split(messages, lambda part: apply_batch(pool, service, part, handler), alone, service)
        await msg.ack()


def passed_over(message: Incoming, wanted: frozenset[str] | None) -> bool:
    """A message whose ``event-type`` header names a type the service never handles on this topic
    (``topics.INBOX_READERS``): left without parsing it, reading its stream or a transaction (most job events
    concern another service). A header that lies can only make the service pass over a forgery: the relay's
    real message of that event still comes, and a handler acts only on the stored event."""
    if wanted is None:
        return False
    named = message.headers.get("event-type")
    return named is not None and named not in wanted


async def remember_dead_lettered(pool: asyncpg.Pool, service: str, message: Incoming) -> None:
    """Claim a dead-lettered message's event id in the service's inbox, so that the same message copied
    back from the dead-letter topic is a duplicate, never handled (a replay is refused; an operator who
    means to redo it sends a new message)."""
    try:
        envelope, _ = parse_event(message)
    except PoisonMessage:
        return  # unreadable: its copy would be unreadable too
    try:
        async with pool.acquire() as conn:
            await claim_dead_lettered(conn, service, envelope.event_id)
    except DATABASE_AWAY as exc:
        log.warning("%s: could not remember dead-lettered %s: %s", service, envelope.event_id, exc)


async def apply_split(messages: list[Incoming], apply: Callable[[list[Incoming]], Awaitable[None]],
                      alone: Callable[[Incoming], Awaitable[None]], service: str = "") -> None:
    """Apply the batch in one transaction; when it fails, apply each half the same way (left first: a
    partition's messages keep their order), down to single messages, which get retries and the
    dead-letter topic (``alone``). One bad message in a batch of n costs about 2 log2(n) transactions
    more, not n: the rest of the batch stays batched."""
    try:
        await apply(messages)
        return
    except Exception as exc:  # noqa: BLE001 - split: retries and dead-lettering apply to single messages
        if len(messages) == 1:
            await alone(messages[0])
            return
        log.info("%s: batch of %d failed (%s); applying its halves", service, len(messages), exc)
    middle = len(messages) // 2
    await apply_split(messages[:middle], apply, alone, service)
    await apply_split(messages[middle:], apply, alone, service)
