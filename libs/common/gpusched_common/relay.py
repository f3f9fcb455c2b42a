"""The outbox relay: publishes committed outbox rows in id order, then marks them published.

The active relay is woken by the commit of every transaction that wrote rows for its producer, in any
process (PostgreSQL's LISTEN/NOTIFY, migration 034; and at once by its own process, ``wake``); it polls
besides, every ``outbox_poll_interval_s``, only to cover a notification lost with a broken connection.

One relay per producer is active at a time (a PostgreSQL advisory lock); a standby takes over when the
active one dies. Leadership is fenced (migration 026): taking the lock takes the producer's next *term*
(``relay_terms``), and a relay publishes a batch, and marks it, only while the term is still its own; one
whose lock went with a broken connection, without it noticing, stops at its next batch instead of
publishing beside its successor. A crash between publishing and marking republishes those rows: consumers
dedupe by event id (the inbox), so at-least-once publishing yields effectively-once effects.

A broker that lost its data (Tansu restarted: it keeps nothing; a Kafka log wiped) is noticed when it
acknowledges a row at an offset below one it acknowledged before on that partition (the highest per
partition is kept with the term, migration 029): the relay then publishes again the rows it published
within ``republish_s`` that some reader has not applied yet (every reader of the topic claimed the others in
its inbox; a topic read without one, such as the agents' commands, goes again whole unless the producer says
which of its rows have done their work: ``done_with``, placement's `services/placement/republish.py`), so
messages no consumer had read are not lost with the broker (consumers dedupe by event id, agents by run and
epoch).

A row the broker refuses for good (too large, an invalid topic, bytes it cannot take) is *parked* with its
error (``parked_at``, ``park_reason``; ``gpusched outbox parked``) and the rows after it go on; any other
failure publishes nothing more of the batch after the failed row (a key's rows stay in order) and is
retried.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import zlib
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg
from aiokafka.errors import InvalidTopicError, MessageSizeTooLargeError, RecordTooLargeError
from faststream.kafka import KafkaBroker

from gpusched_common.ack_offsets import AckOffsets
from gpusched_common.db import keeps_session_state
from gpusched_common.topics import INBOX_READERS, inbox_readers_of

log = logging.getLogger(__name__)

DoneWith = Callable[[asyncpg.Connection, list[asyncpg.Record]], Awaitable[set[int]]]

_BATCH = 500
NOTIFY_CHANNEL = "gpusched_outbox"  # migration 034: every committed outbox row names its producer here
_REFUSED_FOR_GOOD = (MessageSizeTooLargeError, RecordTooLargeError, InvalidTopicError, ValueError, TypeError)


class LostLeadership(RuntimeError):
    """Another relay took this producer's relay (a later term): this one stops publishing."""


class OutboxRelay:
    def __init__(self, pool: asyncpg.Pool, broker: KafkaBroker, producer: str, *, poll_interval_s: float,
                 holder: str | None = None, republish_s: float = 900.0) -> None:
        self._pool = pool
        self._broker = broker
        self._producer = producer
        self._poll_interval_s = poll_interval_s
        self._wake = asyncio.Event()
        self._lock_id = zlib.crc32(f"outbox:{producer}".encode())
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.term: int | None = None  # the term this relay publishes under (None: it is not the active one)
        self.parked = 0
        self._republish_s = republish_s
        self._offsets = AckOffsets()  # the highest offset the broker acknowledged, per partition
        self.losses = 0  # how often the broker was found to have lost data
        # the producer's own judgement, on a republish, of which recent rows (``id``, ``topic``, ``value``)
        # have done their work (a command acknowledged or superseded): those need not go again
        self.done_with: DoneWith | None = None

    def wake(self) -> None:
        """Called after a transaction that wrote outbox rows commits, to publish without polling delay."""
        self._wake.set()

    def _notified(self, _conn: object, _pid: int, _channel: str, producer: str) -> None:
        """A transaction that wrote rows for ``producer`` committed (migration 034's trigger), in any process."""
        if producer == self._producer:
            self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                async with self._pool.acquire() as lock_conn:
                    keeps_session_state(lock_conn)  # its lock and its LISTEN: fully reset when it goes back
                    if not await lock_conn.fetchval("SELECT pg_try_advisory_lock($1)", self._lock_id):
                        await asyncio.sleep(1.0)  # another replica relays for this producer
                        continue
                    await lock_conn.add_listener(NOTIFY_CHANNEL, self._notified)
                    try:
                        self.term = await take_term(lock_conn, self._producer, self.holder)
                        self._offsets = AckOffsets(json.loads(await lock_conn.fetchval(
                            "SELECT high_offsets::text FROM relay_terms WHERE producer = $1", self._producer)))
                        log.info("outbox relay for %s active (term %d)", self._producer, self.term)
                        await self._pump()
                    finally:
                        self.term = None
                        await lock_conn.remove_listener(NOTIFY_CHANNEL, self._notified)
                        await lock_conn.execute("SELECT pg_advisory_unlock($1)", self._lock_id)
            except asyncio.CancelledError:
                raise
            except LostLeadership as exc:
                log.warning("outbox relay for %s: %s; standing by", self._producer, exc)
                await asyncio.sleep(1.0)
            except Exception:  # noqa: BLE001 - the relay must outlive broker and database outages
                log.exception("outbox relay for %s failed; restarting", self._producer)
                await asyncio.sleep(1.0)

    async def _pump(self) -> None:
        while True:
            published = await self.publish_pending()
            if published < _BATCH:
                try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that meets a wake-up,
                    # and a relay that ignores its cancel never lets its service stop
                    async with asyncio.timeout(self._poll_interval_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                self._wake.clear()

    async def publish_pending(self) -> int:
        """Publish one batch of unpublished rows in order, under this relay's term when it has one (tests
        call it directly, without a term); returns how many rows were published or parked. A batch that all
        went through is read, and marked, in one statement each, the term checked within them."""
        async with self._pool.acquire() as conn:
            scanned = await conn.fetch(
                "SELECT (SELECT term FROM relay_terms WHERE producer = $1) AS term, o.* FROM (SELECT 1) AS one"
                " LEFT JOIN LATERAL (SELECT id, topic, key, headers, value FROM outbox"
                " WHERE producer = $1 AND published_at IS NULL AND parked_at IS NULL ORDER BY id LIMIT $2) AS o"
                " ON true", self._producer, _BATCH)
            self._still_leading(scanned[0]["term"])
            rows = [row for row in scanned if row["id"] is not None]
            if not rows:
                return 0
            outcomes = await self._send_in_order(rows)
            done, parked, failure, acks = [], [], None, []
            for row, outcome in zip(rows, outcomes, strict=True):
                if isinstance(outcome, _REFUSED_FOR_GOOD):
                    parked.append((row["id"], f"{type(outcome).__name__}: {outcome}"[:2000]))
                elif isinstance(outcome, BaseException):
                    failure = outcome  # nothing after it is marked: republished in order next time
                    break
                else:
                    done.append(row["id"])
                    acks.append(outcome)
            regressed = self._offsets.note(acks)
            if done and not parked and not regressed and self.term is not None:
                await self._mark_fenced(conn, done)
            else:
                await self._mark(conn, done, parked, regressed, bool(acks))
            for row_id, reason in parked:
                self.parked += 1
                log.error("outbox relay for %s parked row %d, which the broker refuses for good: %s",
                          self._producer, row_id, reason)
            if failure is not None:
                raise failure
            return len(done) + len(parked)

    async def _mark_fenced(self, conn: asyncpg.Connection, done: list[int]) -> None:
        """Mark ``done`` published and keep the acknowledged offsets, in one statement, only while the term
        is still this relay's: updating the term's row waits for, and then sees, a successor's new term."""
        fenced = await conn.fetchval(
            "WITH fence AS (UPDATE relay_terms SET high_offsets = $4::jsonb WHERE producer = $1 AND term = $3"
            " RETURNING term), marked AS (UPDATE outbox SET published_at = clock_timestamp()"
            " WHERE id = ANY($2::bigint[]) AND EXISTS (SELECT 1 FROM fence) RETURNING 1)"
            " SELECT count(*) FROM fence", self._producer, done, self.term, self._offsets.high)
        if not fenced:  # its successor publishes them again (consumers dedupe by event id)
            self._still_leading(await conn.fetchval("SELECT term FROM relay_terms WHERE producer = $1", self._producer))
            raise LostLeadership(f"the producer's term row is gone (this relay held term {self.term})")

    async def _mark(self, conn: asyncpg.Connection, done: list[int], parked: list[tuple[int, str]],
                    regressed: list[str], acked: bool) -> None:
        """Mark what was published and park what the broker refused for good, under the term (locked
        shared), publishing again what a broker that lost data may have lost."""
        async with conn.transaction():
            await self._check_term(conn)
            await conn.execute("UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY($1::bigint[])", done)
            if regressed:
                await self._republish(conn, regressed, done)
            if acked and self.term is not None:
                await conn.execute("UPDATE relay_terms SET high_offsets = $2::jsonb WHERE producer = $1",
                                   self._producer, self._offsets.high)
            for row_id, reason in parked:
                await conn.execute("UPDATE outbox SET parked_at = clock_timestamp(), park_reason = $2 WHERE id = $1",
                                   row_id, reason)

    async def _republish(self, conn: asyncpg.Connection, regressed: list[str], done: list[int]) -> None:
        recent = await conn.fetch(
            "SELECT id, topic, value FROM outbox WHERE producer = $1 AND published_at IS NOT NULL"
            " AND published_at > clock_timestamp() - make_interval(secs => $2) AND NOT (id = ANY($3::bigint[]))",
            self._producer, self._republish_s, done)
        applied = await applied_by_every_reader(conn, recent)
        if self.done_with is not None:
            applied |= await self.done_with(conn, [r for r in recent if r["id"] not in applied])
        again = [r["id"] for r in recent if r["id"] not in applied]
        await conn.execute("UPDATE outbox SET published_at = NULL WHERE id = ANY($1::bigint[])", again)
        self.losses += 1
        log.error("outbox relay for %s: the broker lost data (%s); publishing again %d of the %d row(s) published"
                  " in the last %.0f s (every reader had applied the rest)", self._producer,
                  "; ".join(regressed[:3]), len(again), len(recent), self._republish_s)

    async def _send_in_order(self, rows: list[asyncpg.Record]) -> list[object]:
        """Hand every row to the producer in id order (so a key's rows keep their order), then wait for each
        acknowledgement (acks=all); per row, its acknowledgement (record metadata) or the exception that
        refused it."""
        pending: list[object] = []
        for row in rows:
            try:
                pending.append(await self._broker.publish(bytes(row["value"]), row["topic"], key=row["key"].encode(),
                                                          headers=row["headers"], no_confirm=True))
            except Exception as exc:  # noqa: BLE001 - judged per row by the caller
                pending.append(exc)
        futures = [p for p in pending if not isinstance(p, BaseException)]
        acked = iter(await asyncio.gather(*futures, return_exceptions=True))
        outcomes: list[object] = []
        for handed in pending:
            if isinstance(handed, BaseException):
                outcomes.append(handed)
            else:
                outcomes.append(next(acked))
        return outcomes

    async def _check_term(self, conn: asyncpg.Connection) -> None:
        """The term still this relay's, its row locked shared until the transaction ends."""
        if self.term is None:
            return
        self._still_leading(await conn.fetchval("SELECT term FROM relay_terms WHERE producer = $1 FOR SHARE",
                                                self._producer))

    def _still_leading(self, current: int | None) -> None:
        """Raises ``LostLeadership`` when ``current`` (the producer's term as just read) is not this relay's
        (nothing to check without a term)."""
        if self.term is not None and current != self.term:
            self.term = None
            raise LostLeadership(f"term {current} is another relay's (this one held an earlier term)")


async def take_term(conn: asyncpg.Connection, producer: str, holder: str) -> int:
    """The producer's next relay term, now ``holder``'s."""
    return await conn.fetchval(
        "INSERT INTO relay_terms (producer, term, holder, since) VALUES ($1, 1, $2, clock_timestamp())"
        " ON CONFLICT (producer) DO UPDATE SET term = relay_terms.term + 1, holder = EXCLUDED.holder,"
        " since = EXCLUDED.since RETURNING term", producer, holder)


async def parked_rows(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    """Outbox rows the broker refused for good, oldest first (for operators)."""
    return await conn.fetch("SELECT id, producer, topic, key, headers->>'event-type' AS type, octet_length(value) AS bytes,"
                            " created_at, parked_at, park_reason FROM outbox WHERE parked_at IS NOT NULL ORDER BY id")


async def prune(conn: asyncpg.Connection, service: str, *, outbox_before: datetime, inbox_before: datetime,
                batch: int = 5000) -> tuple[int, int]:
    """Delete this service's published outbox rows and inbox claims older than the given times, a batch at
    a time (no long locks); (outbox rows, inbox rows) deleted. The event store is never pruned."""
    outbox = inbox = 0
    while True:
        n = await conn.fetchval(
            "WITH gone AS (DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE producer = $1"
            " AND published_at < $2 LIMIT $3) RETURNING 1) SELECT count(*) FROM gone", service, outbox_before, batch)
        outbox += n
        if n < batch:
            break
    while True:
        n = await conn.fetchval(
            "WITH gone AS (DELETE FROM inbox WHERE (consumer, event_id) IN (SELECT consumer, event_id FROM inbox"
            " WHERE consumer = $1 AND processed_at < $2 LIMIT $3) RETURNING 1) SELECT count(*) FROM gone",
            service, inbox_before, batch)
        inbox += n
        if n < batch:
            break
    return outbox, inbox


async def applied_by_every_reader(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> set[int]:
    """The outbox rows (``id``, ``topic``, ``value``) whose event every reader of its type on its topic has
    claimed in its inbox (``topics.INBOX_READERS``; a type no reader claims: at once): those need not go to a
    broker that lost them. A row of a topic read without an inbox, or whose envelope cannot be read, is
    never among them."""
    events: dict[int, tuple[str, frozenset[str]]] = {}
    for row in rows:
        if row["topic"] not in INBOX_READERS:
            continue
        try:
            envelope = json.loads(bytes(row["value"]))
            event_id, kind = envelope["event_id"], envelope.get("type")
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        if isinstance(event_id, str):
            events[row["id"]] = (event_id, inbox_readers_of(row["topic"], kind if isinstance(kind, str) else None))
    if not events:
        return set()
    readers = sorted({r for _, needed in events.values() for r in needed})
    claims = await conn.fetch("SELECT consumer, event_id FROM inbox WHERE consumer = ANY($1::text[])"
                              " AND event_id = ANY($2::text[])", readers,
                              sorted({e for e, needed in events.values() if needed}))
    claimed: dict[str, set[str]] = {}
    for claim in claims:
        claimed.setdefault(claim["event_id"], set()).add(claim["consumer"])
    return {row_id for row_id, (event_id, needed) in events.items() if claimed.get(event_id, set()) >= needed}
