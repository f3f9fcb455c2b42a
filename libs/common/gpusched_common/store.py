"""The PostgreSQL event store: streams, global order, outbox and inbox (DESIGN.md section 1).

All functions take a connection that is inside the caller's transaction, so a handler's events, outbox
rows, inbox mark and read-model updates commit or roll back together.
"""

from __future__ import annotations

import json
import uuid
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from gpusched_common import senders, signing
from gpusched_common.events import Envelope


class ConcurrencyError(RuntimeError):
    """Another writer appended to the stream first; reload and decide again."""


@dataclass(frozen=True, order=True)
class Position:
    """A reader's place in the global order: (writing transaction, position within it)."""

    transaction_id: int = 0
    global_position: int = 0


@dataclass(frozen=True)
class StoredEvent:
    position: Position
    recorded_at: datetime
    envelope: Envelope


_COLUMNS = (
    "global_position, transaction_id::text::bigint AS txid, stream_id, version, event_id::text AS event_id, "
    "type, schema_version, occurred_at, recorded_at, producer, tenant, traceparent, payload"
)


def _stored(row: asyncpg.Record) -> StoredEvent:
    envelope = Envelope(
        event_id=row["event_id"], type=row["type"], schema_version=row["schema_version"],
        stream_id=row["stream_id"], stream_version=row["version"], occurred_at=row["occurred_at"],
        producer=row["producer"], tenant=row["tenant"], traceparent=row["traceparent"], payload=row["payload"],
    )
    return StoredEvent(Position(row["txid"], row["global_position"]), row["recorded_at"], envelope)


class ClaimedElsewhere(RuntimeError):
    """A batch's claim was taken by another transaction since the batch looked (a second consumer of the same
    message): the batch rolls back and its messages are applied again one by one, each with its own claim."""


@dataclass
class BatchReads:
    """What one transactional batch read of the store at its start, in two queries instead of one per message:
    which of its messages' event ids the consumer has claimed before, and the job streams its messages name.
    ``claim`` and ``load`` answer from here; the batch's claims are written in one statement before it commits
    (``write_claims``), and a stream the batch appends to is read afresh from then on."""

    conn: asyncpg.Connection  # the batch's transaction: reads on any other connection go to the store
    consumer: str
    event_ids: frozenset[str]
    claimed_before: frozenset[str]
    streams: dict[str, list[StoredEvent]]
    claims: list[str] = field(default_factory=list)


BATCH_READS: ContextVar[BatchReads | None] = ContextVar("gpusched_batch_reads", default=None)


def event_id_of(value: bytes) -> str | None:
    """The event id of a message's envelope, read without validating the rest (None: none readable)."""
    try:
        event_id = json.loads(value).get("event_id")
    except (ValueError, AttributeError, TypeError):
        return None
    return event_id if isinstance(event_id, str) and len(event_id) <= 200 else None


async def read_for_batch(conn: asyncpg.Connection, consumer: str, event_ids: list[str],
                         streams: list[str]) -> BatchReads:
    """The claims of a batch's messages (their ``event_ids``) and the job ``streams`` they name, read in the
    caller's transaction."""
    event_ids = frozenset(event_ids)
    claimed = await conn.fetch("SELECT event_id FROM inbox WHERE consumer = $1 AND event_id = ANY($2::text[])",
                               consumer, sorted(event_ids)) if event_ids else []
    loaded = await _fetch_streams(conn, streams)
    return BatchReads(conn, consumer, event_ids, frozenset(r["event_id"] for r in claimed), loaded)


async def write_claims(conn: asyncpg.Connection, reads: BatchReads) -> None:
    """The batch's claims, in one statement; ``ClaimedElsewhere`` when another transaction took one first."""
    if not reads.claims:
        return
    inserted = await conn.fetch("INSERT INTO inbox (consumer, event_id) SELECT $1, unnest($2::text[])"
                                " ON CONFLICT DO NOTHING RETURNING event_id", reads.consumer, reads.claims)
    if len(inserted) != len(reads.claims):
        raise ClaimedElsewhere(f"{len(reads.claims) - len(inserted)} of the batch's claims were taken meanwhile")


def forget_stream(stream_id: str) -> None:
    """The batch appended to ``stream_id``: read it from the store from now on."""
    reads = BATCH_READS.get()
    if reads is not None:
        reads.streams.pop(stream_id, None)


@dataclass(frozen=True)
class StreamAppend:
    """Events for one stream at versions ``expected_version``+1.. (``outbox_key``: their outbox rows' key)."""

    stream_id: str
    expected_version: int
    envelopes: list[Envelope]
    outbox_key: str | None = None


async def append(conn: asyncpg.Connection, stream_id: str, expected_version: int, envelopes: list[Envelope], *,
                 outbox: tuple[str, str, str] | None = None, then: tuple[str, tuple] | None = None) -> list[Envelope]:
    """Append events at versions expected_version+1.. ; raises ConcurrencyError if the stream moved.

    No read first: the unique (stream_id, version) index rejects a stale expected version, whether the
    other writer committed before us or is still in flight (then this insert waits for it).

    One statement, one round trip: ``outbox`` (producer, topic, key) puts the events in the outbox too (as
    ``enqueue``), and ``then`` (a statement numbering its parameters from $1, and them) runs with them, a
    read model's row."""
    key = outbox[2] if outbox is not None else None
    routed = (outbox[0], outbox[1]) if outbox is not None else None
    return await append_many(conn, [StreamAppend(stream_id, expected_version, envelopes, key)], outbox=routed,
                             then=then)


async def append_many(conn: asyncpg.Connection, appends: list[StreamAppend], *,
                      outbox: tuple[str, str] | None = None, then: tuple[str, tuple] | None = None) -> list[Envelope]:
    """Several streams' appends in one statement (``append``'s guarantees for each): a batch of decisions
    costs one round trip, not one per job. ``outbox`` (producer, topic) puts every event in the outbox, in
    the order given, keyed by its append's ``outbox_key``. The stamped envelopes, in order."""
    if len({a.stream_id for a in appends}) != len(appends):
        raise ConcurrencyError("a stream appears twice in one append: the second was decided without the first")
    stamped: list[Envelope] = []
    keys: list[str | None] = []
    for a in appends:
        stamped += [e.model_copy(update={"stream_id": a.stream_id, "stream_version": a.expected_version + i + 1})
                    for i, e in enumerate(a.envelopes)]
        keys += [a.outbox_key] * len(a.envelopes)
        forget_stream(a.stream_id)
    sql, args = then if then is not None else ("SELECT 1", ())
    first = len(args) + 1
    ctes = [f"appended AS (INSERT INTO events (stream_id, version, event_id, type, schema_version, occurred_at,"
            f" producer, tenant, traceparent, payload) SELECT s, v, e, t, sv, o, p, te, tp, pl FROM unnest("
            f"{_params(first, 'text', 'int', 'uuid', 'text', 'int', 'timestamptz', 'text', 'text', 'text', 'jsonb')})"
            f" WITH ORDINALITY AS x(s, v, e, t, sv, o, p, te, tp, pl, n) ORDER BY n RETURNING 1)"]
    columns = [[getattr(e, name) for e in stamped] for name in _EVENT_FIELDS]
    if outbox is not None:
        producer, topic = outbox
        rows = outbox_rows(topic, stamped)
        ctes.append(f"published AS (INSERT INTO outbox (producer, topic, key, headers, value) SELECT p, t, k, h, b"
                    f" FROM unnest({_params(first + len(columns), 'text', 'text', 'text', 'jsonb', 'bytea')})"
                    f" WITH ORDINALITY AS y(p, t, k, h, b, n) ORDER BY n RETURNING 1)")
        columns += [[producer] * len(rows), [topic] * len(rows), keys, [h for h, _ in rows], [v for _, v in rows]]
    try:
        await conn.execute(f"WITH {', '.join(ctes)} {sql}", *args, *columns)
    except asyncpg.UniqueViolationError as exc:
        # the unique (stream_id, version) index caught a concurrent writer that read the same version
        streams = ", ".join(a.stream_id for a in appends[:3]) + (" ..." if len(appends) > 3 else "")
        raise ConcurrencyError(f"stream(s) {streams} appended concurrently: {exc}") from exc
    return stamped


_EVENT_FIELDS = ("stream_id", "stream_version", "event_id", "type", "schema_version", "occurred_at", "producer",
                 "tenant", "traceparent", "payload")


def _params(first: int, *types: str) -> str:
    """``$first::type[], $first+1::type[], ...``: one array parameter per column, for unnest."""
    return ", ".join(f"${first + i}::{t}[]" for i, t in enumerate(types))


async def load(conn: asyncpg.Connection, stream_id: str, after_version: int = 0) -> list[StoredEvent]:
    """The stream's events in order, those after ``after_version`` (0: all)."""
    reads = BATCH_READS.get()
    cached = reads.streams.get(stream_id) if reads is not None and reads.conn is conn else None
    if cached is not None:
        return [e for e in cached if e.envelope.stream_version > after_version]
    rows = await conn.fetch(f"SELECT {_COLUMNS} FROM events WHERE stream_id = $1 AND version > $2 ORDER BY version",
                            stream_id, after_version)
    return [_stored(r) for r in rows]


async def load_streams(conn: asyncpg.Connection, stream_ids: list[str]) -> dict[str, list[StoredEvent]]:
    """Several streams' events in order, in one query (those a batch read at its start come from there)."""
    reads = BATCH_READS.get()
    cached = reads.streams if reads is not None and reads.conn is conn else {}
    out = {s: cached[s] for s in stream_ids if s in cached}
    out.update(await _fetch_streams(conn, [s for s in stream_ids if s not in out]))
    return out


async def _fetch_streams(conn: asyncpg.Connection, stream_ids: list[str]) -> dict[str, list[StoredEvent]]:
    """Each of these streams' events in order (an empty list for a stream with none), in one query."""
    loaded: dict[str, list[StoredEvent]] = {stream: [] for stream in stream_ids}
    if loaded:
        for row in await conn.fetch(f"SELECT {_COLUMNS} FROM events WHERE stream_id = ANY($1::text[])"
                                    " ORDER BY stream_id, version", sorted(loaded)):
            loaded[row["stream_id"]].append(_stored(row))
    return loaded


async def load_event(conn: asyncpg.Connection, event_id: str, stream_id: str | None = None) -> StoredEvent | None:
    """One event by its id (None: the store has no such event, or the id is no UUID). ``stream_id``: the
    stream it claims to be on; in a batch that read that stream at its start, looked up there first."""
    try:
        uuid.UUID(event_id)
    except ValueError:
        return None
    reads = BATCH_READS.get()
    if stream_id is not None and reads is not None and reads.conn is conn:
        found = next((e for e in reads.streams.get(stream_id, ()) if e.envelope.event_id == event_id), None)
        if found is not None:
            return found
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM events WHERE event_id = $1::uuid", event_id)
    return _stored(row) if row is not None else None


async def read_all(conn: asyncpg.Connection, after: Position = Position(), limit: int = 1000) -> list[StoredEvent]:
    """Events in global order after `after`, never skipping one that commits later.

    Positions come from a sequence, so a transaction that started earlier can commit a smaller position
    after a reader has passed it. Ordering by writing transaction and reading only transactions older
    than the oldest one still running (the snapshot's xmin) closes that gap.
    """
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM events"
        " WHERE (transaction_id, global_position) > ($1::text::xid8, $2)"
        "   AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())"
        " ORDER BY transaction_id, global_position LIMIT $3",
        str(after.transaction_id), after.global_position, limit,
    )
    return [_stored(r) for r in rows]


async def enqueue(conn: asyncpg.Connection, *, producer: str, topic: str, key: str,
                  envelopes: list[Envelope]) -> None:
    """Put messages in the outbox, in order, signed with the process's key where it has one and the topic's
    receivers know senders by their signature (``gpusched_common.senders``: node commands, scale
    decisions); the relay publishes them after this transaction commits."""
    await enqueue_keyed(conn, producer=producer, topic=topic, messages=[(key, e) for e in envelopes])


async def enqueue_keyed(conn: asyncpg.Connection, *, producer: str, topic: str,
                        messages: list[tuple[str, Envelope]]) -> None:
    """``enqueue`` for (key, envelope) pairs of different keys, in order."""
    rows = outbox_rows(topic, [e for _, e in messages])
    await conn.executemany(
        "INSERT INTO outbox (producer, topic, key, headers, value) VALUES ($1, $2, $3, $4, $5)",
        [(producer, topic, key, headers, value) for (key, _), (headers, value) in zip(messages, rows)])


def outbox_rows(topic: str, envelopes: list[Envelope]) -> list[tuple[dict[str, str], bytes]]:
    """(headers, value) of each envelope's outbox row on ``topic``: signed where the topic's receivers know
    senders by their signature."""
    rows = []
    for envelope in envelopes:
        value = envelope.model_dump_json().encode()
        signature = signing.headers_for(topic, value) if senders.signed_topic(topic) else {}
        rows.append(({**_headers(envelope), **signature}, value))
    return rows


def _headers(envelope: Envelope) -> dict[str, str]:
    headers = {"event-type": envelope.type}
    if envelope.traceparent:
        headers["traceparent"] = envelope.traceparent
    return headers


async def claim(conn: asyncpg.Connection, consumer: str, event_id: str) -> bool:
    """Record that `consumer` handled `event_id`; False when it already had (a redelivery). In a batch that
    read its claims at the start (``BatchReads``), the answer comes from there and the claim is written with
    the batch's others before it commits."""
    reads = BATCH_READS.get()
    if reads is not None and reads.conn is conn and reads.consumer == consumer and event_id in reads.event_ids:
        if event_id in reads.claimed_before or event_id in reads.claims:
            return False
        reads.claims.append(event_id)
        return True
    inserted = await conn.fetchval(
        "INSERT INTO inbox (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
        consumer, event_id,
    )
    return inserted is not None


async def claim_dead_lettered(conn: asyncpg.Connection, consumer: str, event_id: str) -> None:
    """Record that ``consumer`` dead-lettered ``event_id``: a copy of it is a duplicate from now on, until an
    operator releases the claim to replay it (``release_dead_lettered``)."""
    await conn.execute("INSERT INTO inbox (consumer, event_id, dead_lettered) VALUES ($1, $2, true)"
                       " ON CONFLICT DO NOTHING", consumer, event_id)


async def release_dead_lettered(conn: asyncpg.Connection, consumer: str, event_id: str) -> bool:
    """Release a dead-letter claim so the message may be handled once more; False when there is none (the
    message was handled after all, or was never dead-lettered by that consumer)."""
    done = await conn.fetchval("DELETE FROM inbox WHERE consumer = $1 AND event_id = $2 AND dead_lettered"
                               " RETURNING 1", consumer, event_id)
    return done is not None
