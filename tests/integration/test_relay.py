"""The outbox relay on the real broker and PostgreSQL (issue 15): leadership fenced by a term (a relay whose
term was taken publishes nothing more), a row the broker refuses for good parked with its error while the
rows after it go out, retention of published rows and old claims (never of the event store), and the
dead-letter claims an operator may release."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpusched_common.db import create_pool
from gpusched_common.messaging import build_broker
from gpusched_common.relay import LostLeadership, OutboxRelay, parked_rows, prune, take_term
from gpusched_common.store import claim, claim_dead_lettered, release_dead_lettered
from tests.integration.kafka_helpers import create_topic, read_topic

TOPIC = "gpusched.test.relay"


async def add_rows(pool, values: list[bytes], producer: str = "svc") -> None:
    await pool.executemany("INSERT INTO outbox (producer, topic, key, headers, value) VALUES ($1, $2, 'k', '{}', $3)",
                           [(producer, TOPIC, v) for v in values])


@pytest.fixture
async def relay_env(settings):
    await create_topic(settings.kafka_bootstrap, TOPIC)
    pool = await create_pool(settings.database_url)
    broker = build_broker(settings, "relay-test")
    await broker.connect()
    try:
        yield pool, broker
    finally:
        await broker.stop()
        await pool.close()


async def test_a_relay_whose_term_was_taken_publishes_nothing_more(relay_env):
    pool, broker = relay_env
    first = OutboxRelay(pool, broker, "svc", poll_interval_s=0.05, holder="first")
    async with pool.acquire() as conn:
        first.term = await take_term(conn, "svc", first.holder)
    await add_rows(pool, [b"one"])
    assert await first.publish_pending() == 1
    async with pool.acquire() as conn:  # another relay took over (the first's lock went with its connection)
        assert await take_term(conn, "svc", "second") == first.term + 1
    await add_rows(pool, [b"two"])
    with pytest.raises(LostLeadership):
        await first.publish_pending()
    assert first.term is None
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 1  # left for the second


async def test_a_row_the_broker_refuses_for_good_is_parked_and_the_rest_go_out(relay_env, settings):
    pool, broker = relay_env
    too_big = b"x" * (settings.kafka_max_request_bytes + 1024)
    await add_rows(pool, [b"before", too_big, b"after"])
    relay = OutboxRelay(pool, broker, "svc", poll_interval_s=0.05)
    assert await relay.publish_pending() == 3
    assert await relay.publish_pending() == 0  # the parked row is not tried again
    records = await read_topic(settings.kafka_bootstrap, TOPIC, expect=2)
    assert [r.value for r in records] == [b"before", b"after"]
    async with pool.acquire() as conn:
        parked = await parked_rows(conn)
    assert len(parked) == 1 and parked[0]["bytes"] == len(too_big)
    assert "MessageSizeTooLarge" in parked[0]["park_reason"] and relay.parked == 1


async def test_retention_deletes_published_rows_and_old_claims_never_events(relay_env):
    pool, _ = relay_env
    now = datetime.now(timezone.utc)
    await add_rows(pool, [b"old", b"unpublished"])
    await pool.execute("UPDATE outbox SET published_at = $1 WHERE value = 'old'", now - timedelta(days=2))
    async with pool.acquire() as conn:
        await claim(conn, "svc", "e-old")
        await claim(conn, "svc", "e-new")
        await claim(conn, "other", "e-old")
        await conn.execute("UPDATE inbox SET processed_at = $1 WHERE event_id = 'e-old'", now - timedelta(days=8))
        events = await conn.fetchval("SELECT count(*) FROM events")
        assert await prune(conn, "svc", outbox_before=now - timedelta(days=1), inbox_before=now - timedelta(days=7),
                           batch=1) == (1, 1)
        assert [r["value"] for r in await conn.fetch("SELECT value FROM outbox")] == [b"unpublished"]
        assert sorted(tuple(r) for r in await conn.fetch("SELECT consumer, event_id FROM inbox")) == [
            ("other", "e-old"), ("svc", "e-new")]
        assert await conn.fetchval("SELECT count(*) FROM events") == events


async def test_only_a_dead_letter_claim_is_released_for_a_replay(relay_env):
    pool, _ = relay_env
    async with pool.acquire() as conn:
        await claim_dead_lettered(conn, "svc", "e-dead")
        await claim(conn, "svc", "e-handled")
        assert not await claim(conn, "svc", "e-dead")  # a copy of it is a duplicate
        assert await release_dead_lettered(conn, "svc", "e-dead")
        assert await claim(conn, "svc", "e-dead")  # released: handled once more
        assert not await release_dead_lettered(conn, "svc", "e-handled")  # a handled message is never released


async def test_an_operator_lists_shows_and_replays_a_dead_lettered_message(settings, monkeypatch, capsys):
    import asyncio
    import json

    from gpusched_cli.main import main
    from gpusched_common import events as ev
    from gpusched_common.messaging import Incoming, parse_event
    from gpusched_common.runtime import Runtime, running

    await create_topic(settings.kafka_bootstrap, "gpusched.jobs.events")  # a gpusched topic to go back to
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("GPUSCHED_KAFKA_BOOTSTRAP", settings.kafka_bootstrap)
    broken, handled = [True], []
    value = ev.make_envelope(ev.JobCancelled(job_id="j-dl", reason="test"), event_id="e-dl", stream_id="job-j-dl",
                             occurred_at=datetime.now(timezone.utc), producer="test").model_dump_json().encode()

    async def setup(runtime: Runtime) -> None:
        async def handle(conn, incoming: Incoming, batch) -> None:
            envelope, _ = parse_event(incoming)
            if not await claim(conn, "dl-test", envelope.event_id):
                return
            if broken[0]:
                raise ValueError("not yet")
            handled.append(envelope.event_id)

        runtime.subscribe_transactional("gpusched.jobs.events", "dl-test-group", handle)

    async with running("dl-test", settings, setup) as runtime:
        await runtime.broker.publish(value, "gpusched.jobs.events", key=b"j-dl")
        await read_topic(settings.kafka_bootstrap, "gpusched.deadletter", expect=1)
        assert await asyncio.to_thread(main, ["deadletter", "list", "--json"]) == 0
        listed = [m for m in json.loads(capsys.readouterr().out) if m["event_id"] == "e-dl"]
        assert len(listed) == 1 and listed[0]["consumer"] == "dl-test" and "not yet" in listed[0]["error"]
        where = listed[0]["where"]
        assert await asyncio.to_thread(main, ["deadletter", "show", where]) == 0
        assert '"e-dl"' in capsys.readouterr().out
        broken[0] = False  # the operator fixed what made it fail
        assert await asyncio.to_thread(main, ["deadletter", "replay", where]) == 0
        assert "handles it once more" in capsys.readouterr().out
        deadline = asyncio.get_running_loop().time() + 20
        while not handled:
            assert asyncio.get_running_loop().time() < deadline, "the replayed message was not handled"
            await asyncio.sleep(0.1)
        assert await asyncio.to_thread(main, ["deadletter", "replay", where]) == 1  # handled now: not sent twice
        assert "holds no dead-letter claim" in capsys.readouterr().err
    assert handled == ["e-dl"]
    assert await asyncio.to_thread(main, ["deadletter", "show", "nonsense"]) == 2
    assert await asyncio.to_thread(main, ["outbox", "parked"]) == 0
