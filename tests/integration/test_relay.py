"""The outbox relay on the real broker and PostgreSQL (issue 15): leadership fenced by a term (a relay whose
term was taken publishes nothing more), a row the broker refuses for good parked with its error while the
rows after it go out, retention of published rows and old claims (never of the event store), the
dead-letter claims an operator may release, and what the relay publishes again after the broker lost its
data."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from gpusched_common.db import create_pool
from gpusched_common.infra.brokers import restart_broker
from gpusched_common.messaging import build_broker
from gpusched_common.relay import LostLeadership, OutboxRelay, parked_rows, prune, take_term
from gpusched_common.store import claim, claim_dead_lettered, release_dead_lettered
from tests.integration.kafka_helpers import create_topic, read_to_end, read_topic

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


async def test_a_term_taken_while_a_batch_is_out_leaves_the_batch_unmarked_for_the_successor(relay_env):
    """The batch is marked in one statement that updates the term's row only while the term is the relay's:
    a successor that took the term meanwhile finds the rows unpublished, and the offsets as they were."""
    pool, broker = relay_env
    first = OutboxRelay(pool, broker, "svc", poll_interval_s=0.05, holder="first")
    async with pool.acquire() as conn:
        first.term = await take_term(conn, "svc", first.holder)
    await add_rows(pool, [b"one", b"two"])
    send = first._send_in_order

    async def send_then_lose_the_term(rows):
        outcomes = await send(rows)
        async with pool.acquire() as conn:
            await take_term(conn, "svc", "second")
        return outcomes

    first._send_in_order = send_then_lose_the_term  # type: ignore[method-assign]
    with pytest.raises(LostLeadership):
        await first.publish_pending()
    assert first.term is None
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 2
    assert await pool.fetchval("SELECT high_offsets::text FROM relay_terms WHERE producer = 'svc'") == "{}"


async def test_a_commit_in_another_process_wakes_the_active_relay_without_polling(relay_env, settings):
    """Rows written by another connection (another replica, an operator's tool) go out on their commit's
    notification (migration 034), long before the relay's next poll; another producer's rows wake nothing."""
    pool, broker = relay_env
    topic = "gpusched.test.relay.woken"
    await create_topic(settings.kafka_bootstrap, topic)
    relay = OutboxRelay(pool, broker, "svc", poll_interval_s=3600.0)
    running = asyncio.create_task(relay.run())
    try:
        while relay.term is None:  # active: the advisory lock, its term and the listener
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # its first pass found nothing; it now waits for a wake or an hour
        insert = "INSERT INTO outbox (producer, topic, key, headers, value) VALUES ($1, $2, 'k', '{}', $3)"
        await pool.execute(insert, "someone-else", topic, b"elsewhere")
        await pool.execute(insert, "svc", topic, b"woken")
        records = await read_topic(settings.kafka_bootstrap, topic, expect=1, timeout_s=30)
        assert [r.value for r in records] == [b"woken"]
        assert await pool.fetchval("SELECT published_at IS NULL FROM outbox WHERE value = 'elsewhere'")
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


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


async def publish_when_back(relay: OutboxRelay, timeout_s: float = 60.0) -> int:
    """Publish the pending rows once the restarted broker takes them (the producer reconnects by itself)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await relay.publish_pending()
        except Exception:  # noqa: BLE001 - the broker is still coming back
            assert asyncio.get_running_loop().time() < deadline, "the broker did not come back"
            await asyncio.sleep(0.5)


async def test_after_the_broker_lost_its_data_the_relay_publishes_again_what_it_had_published(
        relay_env, settings, running_broker):
    pool, broker = relay_env
    relay = OutboxRelay(pool, broker, "svc", poll_interval_s=0.05, republish_s=900)
    async with pool.acquire() as conn:
        relay.term = await take_term(conn, "svc", relay.holder)
    await add_rows(pool, [b"a", b"b", b"c"])
    assert await relay.publish_pending() == 3
    restart_broker(running_broker)
    if not running_broker.keeps_data_across_restart:  # Tansu keeps nothing: the operator recreates the topics
        await create_topic(settings.kafka_bootstrap, TOPIC)
    await add_rows(pool, [b"d"])
    assert await publish_when_back(relay) == 1
    if running_broker.keeps_data_across_restart:  # Apache Kafka kept its log: nothing to publish again
        assert relay.losses == 0
        values = [r.value for r in await read_topic(settings.kafka_bootstrap, TOPIC, expect=4)]
        assert values == [b"a", b"b", b"c", b"d"]
        return
    assert relay.losses == 1  # d was acknowledged at offset 0, where c had been at 2
    assert await pool.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL") == 3
    assert await relay.publish_pending() == 3
    values = [r.value for r in await read_topic(settings.kafka_bootstrap, TOPIC, expect=4)]
    assert values == [b"d", b"a", b"b", b"c"]
    async with pool.acquire() as conn:  # a relay taking over knows the offsets acknowledged so far
        successor = OutboxRelay(pool, broker, "svc", poll_interval_s=0.05)
        successor.term = await take_term(conn, "svc", "successor")
    assert await pool.fetchval("SELECT high_offsets->>'gpusched.test.relay:0' FROM relay_terms") == "3"


async def test_after_the_broker_lost_its_data_the_gateway_publishes_again_what_it_had_published(
        settings, running_broker):
    """What the store has not recorded yet: a submission admission has (a row in `jobs`) goes no more (the
    seed-1 campaign's gateway sent 1,096 again after a Tansu restart, and the probe waited 30 s behind them)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gpusched_common.db import create_pool
    from gpusched_common.producers import ProducerKey
    from gpusched_common.topics import JOBS_SUBMITTED
    from services.gateway.publisher import SubmissionPublisher
    from services.gateway.store import recorded_job_ids

    publisher = SubmissionPublisher(settings, ProducerKey("0123456789abcdef", Ed25519PrivateKey.generate()),
                                    timeout_s=10.0)
    pool = await create_pool(settings.database_url, min_size=0, max_size=2)
    publisher.recorded = lambda job_ids: recorded_job_ids(pool, job_ids)
    try:
        await publisher.publish([("j-1", b"one", None), ("j-2", b"two", None), ("j-0", b"zero", None)])
        await pool.execute("INSERT INTO jobs (job_id, status, version, updated_at) VALUES ('j-0', 'Admitted', 2, now())")
        restart_broker(running_broker)
        if not running_broker.keeps_data_across_restart:
            await create_topic(settings.kafka_bootstrap, JOBS_SUBMITTED.name, partitions=3)
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                await publisher.publish([("j-1", b"three", None)])  # the same key: the same partition as "one"
                break
            except Exception:  # noqa: BLE001 - the broker is still coming back
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.5)
        if running_broker.keeps_data_across_restart:
            records = await read_topic(settings.kafka_bootstrap, JOBS_SUBMITTED.name, expect=4)
            assert publisher.losses == 0 and sorted(r.value for r in records) == [b"one", b"three", b"two", b"zero"]
        else:  # "three" was acknowledged at offset 0, where "one" had been: those before it the store lacks go again
            await publisher.publish([("j-0", b"after", None)])  # behind anything sent again on j-0's partition
            deadline = asyncio.get_running_loop().time() + 30
            while b"after" not in (values := sorted(r.value for r in await read_to_end(settings.kafka_bootstrap,
                                                                                     JOBS_SUBMITTED.name))):
                assert asyncio.get_running_loop().time() < deadline, values
                await asyncio.sleep(0.1)
            assert publisher.losses == 1 and values == [b"after", b"one", b"three", b"two"]
    finally:
        await publisher.stop()
        await pool.close()


async def test_the_gateway_forgets_the_submissions_the_store_has_recorded_and_keeps_the_rest(settings):
    """What the gateway keeps to publish again after a broker lost its data is only what admission has not
    recorded yet: with tens of thousands of jobs waiting it kept every one of the last 15 minutes (about
    1.5 KiB each, the gateway's memory per waiting job in bench-growth; each is kept packed since). A store
    that cannot be read keeps everything until it can."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from gpusched_common.db import create_pool
    from gpusched_common.producers import ProducerKey
    from services.gateway.publisher import SubmissionPublisher
    from services.gateway.store import recorded_job_ids

    publisher = SubmissionPublisher(settings, ProducerKey("0123456789abcdef", Ed25519PrivateKey.generate()),
                                    timeout_s=10.0)
    pool = await create_pool(settings.database_url, min_size=0, max_size=2)
    try:
        await publisher.publish([("f-1", b"one", None), ("f-2", b"two", None), ("f-3", b"three", None)])
        await publisher.publish([("f-1", b"cancel f-1", None)], topic="gpusched.jobs.control",
                                event_type="JobCancelRequested")
        assert await publisher.forget_recorded() == 0 and publisher.kept() == 4  # no store to ask yet

        async def away(job_ids):
            raise ConnectionRefusedError("the store is away")

        publisher.recorded = away
        with pytest.raises(ConnectionRefusedError):
            await publisher.forget_recorded()
        assert publisher.kept() == 4
        publisher.recorded = lambda job_ids: recorded_job_ids(pool, job_ids)
        await pool.execute("INSERT INTO jobs (job_id, status, version, updated_at) VALUES"
                           " ('f-1', 'Admitted', 2, now()), ('f-3', 'Rejected', 2, now())")
        assert await publisher.forget_recorded() == 2
        assert publisher.kept() == 2  # f-2's submission, and the control request (not a submission)
        await publisher.publish([("f-4", b"four", None)])  # a publish after the forgetting is kept too
        assert publisher.kept() == 3 and await publisher.forget_recorded() == 0
    finally:
        await publisher.stop()
        await pool.close()


async def test_a_consumer_whose_position_outlived_the_broker_s_data_reads_the_new_log_from_its_start(
        settings, running_broker):
    """Its group is gone with the broker's data, but the offset of a batch in flight at the restart reaches
    the new broker as the group's: the consumer rejoins at offset 8 of a log of two records, and Tansu
    answers it with nothing (Apache Kafka, which keeps its data, needs none of this)."""
    from aiokafka import AIOKafkaProducer

    from gpusched_common.runtime import running

    seen: list[bytes] = []

    async def setup(runtime) -> None:
        async def handler(message) -> None:
            seen.append(message.value)
        runtime.subscribe(TOPIC, "position-guard-test", handler)

    async def produce(values: list[bytes]) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
        await producer.start()
        try:
            for value in values:
                await producer.send_and_wait(TOPIC, value, key=b"k")
        finally:
            await producer.stop()

    async def wait_for(values: list[bytes], timeout_s: float = 60.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not set(values) <= set(seen):
            assert asyncio.get_running_loop().time() < deadline, f"never read {values}: {seen}"
            await asyncio.sleep(0.1)

    await create_topic(settings.kafka_bootstrap, TOPIC)
    async with running("guard-test", settings, setup, uses_database=False):
        await produce([f"old-{i}".encode() for i in range(8)])
        await wait_for([f"old-{i}".encode() for i in range(8)])  # the consumer's position: 8
        restart_broker(running_broker)
        if not running_broker.keeps_data_across_restart:
            # the batch in flight at the restart has its offset committed to the new broker from memory. Done
            # with this loop held (a thread, joined), so the service's consumer cannot rejoin first: the new
            # broker refuses a commit from outside a group that has members.
            async def on_the_new_broker() -> None:
                await create_topic(settings.kafka_bootstrap, TOPIC)
                await commit_offset(settings.kafka_bootstrap, "position-guard-test", 8)
            with ThreadPoolExecutor(1) as helper:
                helper.submit(asyncio.run, on_the_new_broker()).result(timeout=120)
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            try:
                await produce([b"new-0", b"new-1"])  # offsets 0 and 1 of the new log (Tansu)
                break
            except Exception:  # noqa: BLE001 - the broker is still coming back
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.5)
        await wait_for([b"new-0", b"new-1"])  # not skipped: the log never reaches offset 8 again here


async def commit_offset(bootstrap: str, group: str, offset: int) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    deadline = asyncio.get_running_loop().time() + 60
    while True:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        try:
            await consumer.start()
            consumer.assign([TopicPartition(TOPIC, 0)])
            await consumer.commit({TopicPartition(TOPIC, 0): offset})
            return
        except Exception:  # noqa: BLE001 - the broker is still coming back
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.5)
        finally:
            await consumer.stop()


async def test_what_every_reader_of_its_topic_applied_is_not_published_again(database_url):
    """After a broker lost its data the relay sends again only what some reader of its type has not claimed
    in its inbox (a type no reader claims: never); the agents' commands, read without an inbox, and rows
    whose event cannot be read always go again."""
    from gpusched_common.relay import applied_by_every_reader
    from gpusched_common.topics import JOBS_EVENTS, NODES_COMMANDS, QUOTA_RECLAIMS

    def row(row_id: int, topic: str, event_id: str | None, kind: str = "JobHeld") -> dict:
        return {"id": row_id, "topic": topic, "value": b"not json" if event_id is None else
                f'{{"event_id": "{event_id}", "type": "{kind}"}}'.encode()}

    rows = [row(1, JOBS_EVENTS.name, "e-all"), row(2, JOBS_EVENTS.name, "e-one", "JobCancelled"),
            row(3, NODES_COMMANDS.name, "e-cmd"), row(4, QUOTA_RECLAIMS.name, "e-reclaim"),
            row(5, JOBS_EVENTS.name, None), row(6, JOBS_EVENTS.name, "e-dl"),
            row(7, JOBS_EVENTS.name, "e-none", "QuotaDeferred"), row(8, JOBS_EVENTS.name, "e-def", "PlacementDeferred")]
    pool = await create_pool(database_url)
    try:
        async with pool.acquire() as conn:
            for consumer in ("quota", "placement"):  # JobHeld: quota's and placement's (preemption passes it)
                await claim(conn, consumer, "e-all")
                await claim(conn, consumer, "e-cmd")  # claimed or not, the agents keep no inbox
            await claim(conn, "quota", "e-one")  # placement has not applied it yet
            await claim(conn, "quota", "e-reclaim")  # not its reader
            await claim(conn, "quota", "e-dl")
            await claim_dead_lettered(conn, "placement", "e-dl")  # a copy would be a duplicate to it as well
            await claim(conn, "preemption", "e-def")
            assert await applied_by_every_reader(conn, rows) == {1, 6, 7, 8}
            assert await applied_by_every_reader(conn, []) == set()
    finally:
        await pool.close()
