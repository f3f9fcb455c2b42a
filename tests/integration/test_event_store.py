"""Event store contract on real PostgreSQL: append/load, optimistic concurrency, global order."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gpusched_common import events as ev
from gpusched_common import store
from gpusched_common.db import connect
from tests.builders import T0


def envelope(job: str = "j1") -> ev.Envelope:
    return ev.make_envelope(ev.JobCancelled(job_id=job, reason="test"), event_id=str(uuid.uuid4()),
                            stream_id=f"job-{job}", occurred_at=T0, producer="test")


async def test_appended_events_load_back_in_version_order(database_url):
    conn = await connect(database_url)
    try:
        await store.append(conn, "s1", 0, [envelope(), envelope()])
        await store.append(conn, "s1", 2, [envelope()])
        loaded = await store.load(conn, "s1")
        assert [e.envelope.stream_version for e in loaded] == [1, 2, 3]
        assert loaded[0].envelope.payload == {"job_id": "j1", "reason": "test", "requested_by": None}
    finally:
        await conn.close()


async def test_appending_at_a_stale_version_is_a_conflict(database_url):
    conn = await connect(database_url)
    try:
        await store.append(conn, "s1", 0, [envelope()])
        with pytest.raises(store.ConcurrencyError):
            await store.append(conn, "s1", 0, [envelope()])
    finally:
        await conn.close()


async def test_two_concurrent_appends_at_the_same_version_one_wins(database_url):
    a, b = await connect(database_url), await connect(database_url)
    try:
        ta, tb = a.transaction(), b.transaction()
        await ta.start()
        await tb.start()
        await store.append(a, "s1", 0, [envelope()])
        # b read version 0 too; its insert waits on a's uncommitted row, then hits the unique index
        pending = asyncio.create_task(store.append(b, "s1", 0, [envelope()]))
        await asyncio.sleep(0.2)
        await ta.commit()
        with pytest.raises(store.ConcurrencyError):
            await pending
        await tb.rollback()
        assert [e.envelope.stream_version for e in await store.load(a, "s1")] == [1]
    finally:
        await a.close()
        await b.close()


async def test_a_reader_never_skips_an_event_that_commits_out_of_order(database_url):
    slow, fast, reader = [await connect(database_url) for _ in range(3)]
    try:
        slow_tx = slow.transaction()
        await slow_tx.start()
        await store.append(slow, "slow", 0, [envelope("slow")])  # takes the smaller position, commits last
        async with fast.transaction():
            await store.append(fast, "fast", 0, [envelope("fast")])
        # while the slow transaction runs, the reader must not move past it
        assert await store.read_all(reader) == []
        await slow_tx.commit()
        seen = await store.read_all(reader)
        assert [e.envelope.stream_id for e in seen] == ["slow", "fast"]
        assert await store.read_all(reader, after=seen[-1].position) == []
        positions = [e.position for e in seen]
        assert positions == sorted(positions)
    finally:
        for conn in (slow, fast, reader):
            await conn.close()


async def test_the_inbox_claims_an_event_id_once_per_consumer(database_url):
    conn = await connect(database_url)
    try:
        assert await store.claim(conn, "quota", "e1")
        assert not await store.claim(conn, "quota", "e1")
        assert await store.claim(conn, "placement", "e1")
    finally:
        await conn.close()
