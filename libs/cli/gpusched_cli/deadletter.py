"""`gpusched deadletter` and `gpusched outbox`: what could not be handled or published, for operators.

    gpusched deadletter list [--limit 50] [--json]      # newest last: where from, which consumer, why
    gpusched deadletter show PARTITION:OFFSET [--json]  # one message: its headers and value
    gpusched deadletter replay PARTITION:OFFSET         # send it to its topic again, to be handled once more
    gpusched outbox parked [--json]                     # rows the broker refused for good

A dead-lettered message is remembered by the consumer that gave up on it (its event id in the inbox), so a
copy sent back with a plain Kafka client is a duplicate. `replay` is the operator's way: it releases that
consumer's claim in the store, then sends the message as it was. A message that cannot be read is not
replayed (it would only be dead-lettered again), nor one whose consumer handled it since.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from gpusched_cli.operator_settings import operator_settings
from gpusched_cli.tokens import when, with_conn
from gpusched_common.events import Envelope
from gpusched_common.kafka_admin import read_to_end
from gpusched_common.kafka_client import client_options
from gpusched_common.relay import parked_rows
from gpusched_common.settings import Settings
from gpusched_common.store import release_dead_lettered
from gpusched_common.table import render
from gpusched_common.topics import ALL_TOPICS, DEADLETTER


def add_deadletter_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("deadletter", help="messages consumers gave up on: list, show, replay (operators)")
    sub = p.add_subparsers(dest="deadletter_cmd", required=True)
    listing = sub.add_parser("list", help="the dead-letter topic's messages, newest last")
    listing.add_argument("--limit", type=int, default=50, help="at most this many, the newest (default 50)")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    show = sub.add_parser("show", help="one dead-lettered message, its headers and value")
    show.add_argument("where", metavar="PARTITION:OFFSET")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    replay = sub.add_parser("replay", help="send a dead-lettered message to its topic again (its consumer's claim "
                                           "released)")
    replay.add_argument("where", metavar="PARTITION:OFFSET")
    replay.set_defaults(func=cmd_replay)
    p = subparsers.add_parser("outbox", help="the services' outboxes: rows parked because the broker refused them")
    sub = p.add_subparsers(dest="outbox_cmd", required=True)
    parked = sub.add_parser("parked", help="rows the broker refused for good, with the error")
    parked.add_argument("--json", action="store_true")
    parked.set_defaults(func=cmd_parked)


def _fail(message: object, code: int, what: str = "deadletter") -> int:
    print(f"gpusched {what}: {message}", file=sys.stderr)
    return code


def _where(text: str) -> tuple[int, int] | None:
    partition, sep, offset = text.partition(":")
    if not sep or not partition.isdigit() or not offset.isdigit() or len(text) > 40:
        return None
    return int(partition), int(offset)


async def read_all(settings: Settings, limit_s: float = 30.0) -> list[Any]:
    """Every record on the dead-letter topic up to its end now, oldest first."""
    records = await read_to_end(client_options(settings), DEADLETTER.name, limit_s=limit_s)
    return sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))


def _headers(record: Any) -> dict[str, str]:
    return {k: v.decode(errors="replace") for k, v in record.headers}


def _event(record: Any) -> Envelope | None:
    try:
        return Envelope.model_validate_json(record.value or b"")
    except ValueError:
        return None


def _summary(record: Any) -> dict[str, Any]:
    headers, envelope = _headers(record), _event(record)
    return {"where": f"{record.partition}:{record.offset}", "source": headers.get("dlq-source-topic", ""),
            "source_offset": f"{headers.get('dlq-source-partition', '')}:{headers.get('dlq-source-offset', '')}",
            "consumer": headers.get("dlq-consumer", ""), "attempts": headers.get("dlq-attempts", ""),
            "type": envelope.type if envelope else headers.get("event-type", "(unreadable)"),
            "event_id": envelope.event_id if envelope else None, "error": headers.get("dlq-error", "")}


def _read(settings: Settings) -> list[Any]:
    return asyncio.run(read_all(settings))


def cmd_list(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        return _fail("--limit must be positive", 2)
    try:
        records = _read(operator_settings())[-args.limit:]
    except (KafkaError, OSError, TimeoutError) as exc:
        return _fail(f"broker: {exc}", 1)
    found = [_summary(r) for r in records]
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    print(render(["WHERE", "FROM", "CONSUMER", "TYPE", "TRIES", "ERROR"],
                 [(f["where"], f"{f['source']}@{f['source_offset']}", f["consumer"], f["type"], f["attempts"],
                   f["error"][:70]) for f in found]))
    return 0


def _find(where: str) -> tuple[Any | None, int]:
    spot = _where(where)
    if spot is None:
        return None, _fail(f"{where[:40]!r} is not PARTITION:OFFSET (see `gpusched deadletter list`)", 2)
    try:
        records = _read(operator_settings())
    except (KafkaError, OSError, TimeoutError) as exc:
        return None, _fail(f"broker: {exc}", 1)
    record = next((r for r in records if (r.partition, r.offset) == spot), None)
    if record is None:
        return None, _fail(f"no dead-lettered message at {where}", 1)
    return record, 0


def cmd_show(args: argparse.Namespace) -> int:
    record, code = _find(args.where)
    if record is None:
        return code
    value = (record.value or b"").decode(errors="replace")
    if args.json:
        print(json.dumps({**_summary(record), "headers": _headers(record), "value": value}, indent=2))
        return 0
    for name, text in sorted(_headers(record).items()):
        print(f"{name}: {text}")
    print()
    print(value)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    record, code = _find(args.where)
    if record is None:
        return code
    summary, headers = _summary(record), _headers(record)
    source, consumer = summary["source"], summary["consumer"]
    if source not in {t.name for t in ALL_TOPICS} or source == DEADLETTER.name:
        return _fail(f"the message names no gpusched topic to go back to ({source[:60]!r})", 1)
    if summary["event_id"] is None:
        return _fail("the message cannot be read: sent again it would only be dead-lettered again", 1)

    async def release(conn: asyncpg.Connection) -> bool:
        return await release_dead_lettered(conn, consumer, summary["event_id"])

    try:
        released = with_conn(release)
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if not released:
        return _fail(f"{consumer or 'no consumer'} holds no dead-letter claim on {summary['event_id']}: it was handled "
                     "since, or never dead-lettered there; not sent again", 1)
    kept = [(k, v.encode()) for k, v in headers.items() if not k.startswith("dlq-")]

    async def send() -> None:
        producer = AIOKafkaProducer(**client_options(operator_settings()), acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(source, record.value, key=record.key, headers=kept)
        finally:
            await producer.stop()

    try:
        asyncio.run(send())
    except (KafkaError, OSError) as exc:
        return _fail(f"broker: {exc} (the claim was released: run replay again once the broker answers)", 1)
    print(f"sent {summary['type']} {summary['event_id']} back to {source}; {consumer} handles it once more")
    return 0


def cmd_parked(args: argparse.Namespace) -> int:
    try:
        rows = [dict(r) for r in with_conn(parked_rows)]
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1, "outbox")
    if args.json:
        print(json.dumps([{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows],
                         indent=2))
        return 0
    print(render(["ID", "PRODUCER", "TOPIC", "TYPE", "BYTES", "PARKED", "WHY"],
                 [(r["id"], r["producer"], r["topic"], r["type"] or "", r["bytes"], when(r["parked_at"]),
                   (r["park_reason"] or "")[:70]) for r in rows]))
    return 0
