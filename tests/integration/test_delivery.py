"""Delivery semantics on the real broker and real PostgreSQL: redelivery, outbox crash recovery,
consumer restarts and dead-lettering."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import asyncpg

from gpusched_core import lifecycle
from gpusched_common.batching import apply_batch
from gpusched_common.db import connect, create_pool
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, build_broker
from gpusched_common.relay import OutboxRelay
from gpusched_common.runtime import Runtime, running
from gpusched_common.store import claim
from gpusched_common.topics import DEADLETTER, JOBS_EVENTS, JOBS_SUBMITTED
from services.admission.app import setup as admission_setup
from services.admission.core import AdmissionLimits, RateLimit
from services.admission.handlers import AdmissionPolicy, make_submission_handler
from gpusched_cli.client import Client, submission_bytes
from tests.builders import T0, a_job
from tests.integration.kafka_helpers import create_topic, read_to_end, read_topic


def now() -> datetime:
    return datetime.now(timezone.utc)


async def stream_types(database_url: str, job_id: str) -> list[str]:
    conn = await connect(database_url)
    try:
        rows = await conn.fetch("SELECT type FROM events WHERE stream_id = $1 ORDER BY version", f"job-{job_id}")
        return [r["type"] for r in rows]
    finally:
        await conn.close()


async def test_the_same_submission_delivered_twice_changes_state_once(settings):
    pool = await create_pool(settings.database_url)
    try:
        policy = AdmissionPolicy(AdmissionLimits(), RateLimit(1000, 1000), keys=None, require_credentials=False)
        handler = make_submission_handler(policy, now)

        async def handle(message: Incoming) -> None:
            await apply_batch(pool, "admission", [message], handler)

        message = Incoming(JOBS_SUBMITTED.name, 0, 7, "j1", submission_bytes(a_job("j1").spec(), "j1", now=T0), {})
        await handle(message)
        await handle(message)  # redelivered after a crash before the offset commit
        # a client retry: same job id, new event id
        await handle(Incoming(JOBS_SUBMITTED.name, 0, 8, "j1", submission_bytes(a_job("j1").spec(), "j1"), {}))
        assert await stream_types(settings.database_url, "j1") == ["JobSubmitted", "JobAdmitted"]
        assert await pool.fetchval("SELECT count(*) FROM outbox") == 2
    finally:
        await pool.close()


async def test_a_batch_reads_its_claims_and_streams_at_once_and_keeps_exactly_once(settings):
    """A batch answers claims and job streams from two reads at its start (issue 16): a message delivered
    twice in one batch, one claimed by an earlier batch and a retry of an admitted job each change nothing;
    a claim another transaction takes while the batch runs rolls the batch back (its messages then go one
    by one, each with its own claim)."""
    pool = await create_pool(settings.database_url)
    try:
        policy = AdmissionPolicy(AdmissionLimits(), RateLimit(1000, 1000), keys=None, require_credentials=False)
        handler = make_submission_handler(policy, now)

        def submitted(job_id: str, offset: int) -> Incoming:
            return Incoming(JOBS_SUBMITTED.name, 0, offset, job_id, submission_bytes(a_job(job_id).spec(), job_id), {})

        early = submitted("b-early", 1)
        await apply_batch(pool, "admission", [early], handler)
        twice, fresh = submitted("b-twice", 2), submitted("b-fresh", 3)
        retry = submitted("b-early", 4)  # a client retry of the admitted job: a new event id, the same job
        await apply_batch(pool, "admission", [early, twice, fresh, twice, retry], handler)
        for job_id in ("b-early", "b-twice", "b-fresh"):
            assert await stream_types(settings.database_url, job_id) == ["JobSubmitted", "JobAdmitted"]
        claims = await pool.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'admission' AND event_id LIKE '%-%'")
        assert claims == 4  # early, twice, fresh, retry: each once

        late, taken = submitted("b-late", 5), submitted("b-taken", 6)

        async def claims_first_elsewhere(conn, message: Incoming, batch) -> None:  # noqa: ANN001
            if message is taken:  # a second consumer of the same message claims it and commits meanwhile
                async with pool.acquire() as other:
                    await claim(other, "admission", json.loads(taken.value)["event_id"])
            await handler(conn, message, batch)

        try:
            await apply_batch(pool, "admission", [late, taken], claims_first_elsewhere)
            raise AssertionError("the batch committed although one of its claims was taken")
        except Exception as exc:  # noqa: BLE001 - the store's ClaimedElsewhere
            assert type(exc).__name__ == "ClaimedElsewhere"
        assert await stream_types(settings.database_url, "b-late") == []  # rolled back with the batch
        assert await stream_types(settings.database_url, "b-taken") == []
    finally:
        await pool.close()


async def test_a_tenant_s_rate_holds_across_the_messages_of_one_batch(settings):
    """The rate bucket is read once per batch and written at its end (issue 16): within one batch the third
    submission of a tenant whose burst is 2 is rejected, another tenant's is not, and the next batch starts
    from the tokens the first one left."""
    pool = await create_pool(settings.database_url)
    try:
        policy = AdmissionPolicy(AdmissionLimits(), RateLimit(0.001, 2), keys=None, require_credentials=False)
        handler = make_submission_handler(policy, now)

        def submitted(job_id: str, tenant: str, offset: int) -> Incoming:
            spec = a_job(job_id).tenant(tenant).spec()
            return Incoming(JOBS_SUBMITTED.name, 0, offset, job_id, submission_bytes(spec, job_id), {})

        await apply_batch(pool, "admission", [submitted("r1", "rt-a", 1), submitted("r2", "rt-a", 2),
                                              submitted("r3", "rt-a", 3), submitted("r4", "rt-b", 4)], handler)
        assert [await stream_types(settings.database_url, j) for j in ("r1", "r2", "r3", "r4")] == [
            ["JobSubmitted", "JobAdmitted"], ["JobSubmitted", "JobAdmitted"], ["JobRejected"],
            ["JobSubmitted", "JobAdmitted"]]
        tokens = await pool.fetchval("SELECT tokens FROM admission_rate_buckets WHERE tenant = 'rt-a'")
        assert tokens < 1
        await apply_batch(pool, "admission", [submitted("r5", "rt-a", 5), submitted("r6", "rt-b", 6)], handler)
        assert await stream_types(settings.database_url, "r5") == ["JobRejected"]
        assert await stream_types(settings.database_url, "r6") == ["JobSubmitted", "JobAdmitted"]
    finally:
        await pool.close()


async def test_the_outbox_publishes_after_a_crash_between_commit_and_publish(settings):
    pool = await create_pool(settings.database_url)
    broker = build_broker(settings, "relay-test")
    try:
        # a handler commits its events and "crashes" before any relay published them
        async with pool.acquire() as conn, conn.transaction():
            state = await load_job(conn, "j1")
            events = lifecycle.decide(state, lifecycle.RegisterSubmission(a_job("j1").spec(), T0), T0)
            await append_job_events(conn, state, events, producer="admission", now=T0)
        # a new process starts its relay: the rows go out, in order, and are marked
        await broker.connect()
        relay = OutboxRelay(pool, broker, "admission", poll_interval_s=0.05)
        assert await relay.publish_pending() == 2
        assert await relay.publish_pending() == 0
        records = await read_topic(settings.kafka_bootstrap, JOBS_EVENTS.name, expect=2)
        assert [json.loads(r.value)["type"] for r in records] == ["JobSubmitted", "JobAdmitted"]
        assert all(r.key == b"j1" for r in records)
        # crash after publishing but before marking: the rows go out again (consumers dedupe by event id)
        await pool.execute("UPDATE outbox SET published_at = NULL")
        assert await relay.publish_pending() == 2
        again = await read_topic(settings.kafka_bootstrap, JOBS_EVENTS.name, expect=4)
        assert [json.loads(r.value)["event_id"] for r in again[2:]] == [json.loads(r.value)["event_id"]
                                                                          for r in records]
    finally:
        await broker.stop()
        await pool.close()


async def test_a_consumer_restarted_mid_stream_resumes_from_its_committed_offset(settings):
    topic, total = "gpusched.test.resume", 60
    await create_topic(settings.kafka_bootstrap, topic)
    conn = await connect(settings.database_url)
    await conn.execute("CREATE TABLE handled (n int PRIMARY KEY)")
    await conn.close()
    seen: list[int] = []

    async def setup(runtime: Runtime) -> None:
        async def handle(message: Incoming) -> None:
            n = int(message.value)
            async with runtime.pool.acquire() as c, c.transaction():
                if await claim(c, "resume-test", f"m{n}"):
                    await c.execute("INSERT INTO handled VALUES ($1)", n)
            seen.append(n)

        runtime.subscribe(topic, "resume-group", handle)

    producer = build_broker(settings, "producer")
    await producer.connect()
    for n in range(total // 2):
        await producer.publish(str(n).encode(), topic, key=b"k")
    async with running("resume-1", settings, setup):
        await _until(lambda: len(seen) >= total // 2)
    first_run = len(seen)
    for n in range(total // 2, total):  # produced while no consumer runs
        await producer.publish(str(n).encode(), topic, key=b"k")
    async with running("resume-2", settings, setup):
        await _until(lambda: total - 1 in seen)
    await producer.stop()
    second_run = seen[first_run:]
    assert second_run[0] >= total // 2 - 1, "the restarted consumer re-read from the beginning"
    conn = await connect(settings.database_url)
    try:
        assert [r["n"] for r in await conn.fetch("SELECT n FROM handled ORDER BY n")] == list(range(total))
    finally:
        await conn.close()


async def test_malformed_input_is_dead_lettered_and_the_consumer_carries_on(settings, tmp_path):

    from gpusched_common.credentials import TenantKey, new_secret, write_keys
    from gpusched_common.identity import OPERATOR

    keys = tmp_path / "tenant-keys.yaml"  # admission requires a credential: the good submission carries one
    write_keys(keys, [TenantKey("operator-test", OPERATOR, new_secret().encode())])
    settings = settings.model_copy(update={"tenant_keys_file": keys})
    async with running("admission", settings, admission_setup), Client(settings) as client:
        await client.submit_raw("junk", b"{this is not json", {"traceparent": "garbage"})
        good = await client.submit(a_job("j-after").spec(), job_id="j-after")
        dead = await read_topic(settings.kafka_bootstrap, DEADLETTER.name, expect=1)
        assert dead[0].value == b"{this is not json"
        headers = {k: v.decode() for k, v in dead[0].headers}
        assert headers["dlq-error"].startswith("PoisonMessage: submission is not valid JSON")
        assert headers["dlq-source-topic"] == JOBS_SUBMITTED.name
        await _until_async(lambda: stream_types(settings.database_url, good), ["JobSubmitted", "JobAdmitted"])


async def test_a_handler_that_keeps_failing_is_dead_lettered_after_bounded_retries(settings):
    attempts = []

    async def setup(runtime: Runtime) -> None:
        async def handle(message: Incoming) -> None:
            attempts.append(message.offset)
            if message.value == b"bad":
                raise ValueError("cannot handle this")

        runtime.subscribe("gpusched.test.retry", "retry-group", handle)

    async with running("retry", settings, setup, uses_database=False) as runtime:
        await runtime.broker.publish(b"bad", "gpusched.test.retry", key=b"k")
        await runtime.broker.publish(b"good", "gpusched.test.retry", key=b"k")
        await _until(lambda: len(attempts) >= settings.handler_max_attempts + 1)
    dead = await read_topic(settings.kafka_bootstrap, DEADLETTER.name, expect=1)
    assert len(dead) == 1 and dead[0].value == b"bad"
    assert dict(dead[0].headers)["dlq-attempts"] == str(settings.handler_max_attempts).encode()
    assert attempts == [0] * settings.handler_max_attempts + [1]


async def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _until_async(probe, expected, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (value := await probe()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"timed out; last value {value!r}"
        await asyncio.sleep(0.1)


__all__ = ["asyncpg"]


async def test_a_dead_lettered_message_copied_back_from_the_dead_letter_topic_is_not_handled(settings):
    """A transactional consumer remembers what it dead-lettered (its event id, in its inbox): the same
    message replayed from the dead-letter topic is a duplicate; a new message is handled as ever."""
    from gpusched_common import events as ev

    await create_topic(settings.kafka_bootstrap, "gpusched.test.replay")
    handled: list[str] = []

    def message(job_id: str) -> bytes:
        return ev.make_envelope(ev.JobCancelled(job_id=job_id, reason="test"), event_id=f"e-{job_id}",
                                stream_id=f"job-{job_id}", occurred_at=now(), producer="test").model_dump_json().encode()

    async def setup(runtime: Runtime) -> None:
        async def handle(conn, incoming: Incoming, batch) -> None:
            envelope, payload = ev_parse(incoming)
            if not await claim(conn, "replay", envelope.event_id):
                return
            handled.append(payload.job_id)
            if payload.job_id == "bad":
                raise ValueError("cannot handle this")

        runtime.subscribe_transactional("gpusched.test.replay", "replay-group", handle)

    from gpusched_common.messaging import parse_event as ev_parse

    async with running("replay", settings, setup) as runtime:
        bad = message("bad")
        await runtime.broker.publish(bad, "gpusched.test.replay", key=b"k")
        dead = await read_topic(settings.kafka_bootstrap, DEADLETTER.name, expect=1)
        await runtime.broker.publish(dead[0].value, "gpusched.test.replay", key=b"k")  # the replay
        await runtime.broker.publish(message("after"), "gpusched.test.replay", key=b"k")
        await _until(lambda: "after" in handled)
    # the batch's try and the message's own tries before its dead letter; the replay, none
    assert handled.count("bad") == 1 + settings.handler_max_attempts
    # the copy came before "after" on the same partition: had it been handled, it would be dead-lettered by now
    dead = [r for r in await read_to_end(settings.kafka_bootstrap, DEADLETTER.name) if r.value == bad]
    assert len(dead) == 1  # not dead-lettered twice: the copy was never handled


async def test_a_message_larger_than_a_fetch_still_comes_whole_in_order_with_those_around_it(settings):
    """Consumers fetch at most ``kafka_fetch_max_bytes`` of a partition at once (what a lagging consumer holds
    is bounded by it, not by its lag); a message far larger than that still comes, whole and in order, on
    both brokers."""
    from aiokafka import AIOKafkaProducer

    from gpusched_common import events as ev
    from gpusched_common.messaging import consumer_options

    small = settings.model_copy(update={"kafka_fetch_max_bytes": 16 * 1024})
    options = consumer_options(small, "fetch-group")
    assert options["fetch_max_bytes"] == options["max_partition_fetch_bytes"] == 16 * 1024
    seen: list[tuple[str, int]] = []

    def message(job_id: str, reason: str) -> bytes:
        return ev.make_envelope(ev.JobCancelled(job_id=job_id, reason=reason), event_id=f"e-{job_id}",
                                stream_id=f"job-{job_id}", occurred_at=now(), producer="test").model_dump_json().encode()

    async def setup(runtime: Runtime) -> None:
        async def handle(conn, incoming: Incoming, batch) -> None:
            seen.append((incoming.key or "", len(incoming.value)))

        runtime.subscribe_transactional(JOBS_EVENTS.name, "fetch-group", handle)

    big = message("big", "x" * (1024 * 1024))  # 64 fetches' worth, in one record batch
    values = [message(f"s{i}", "small") for i in range(300)] + [big] + [message(f"t{i}", "small") for i in range(300)]
    producer = AIOKafkaProducer(bootstrap_servers=small.kafka_bootstrap, linger_ms=5,
                                max_request_size=small.kafka_max_request_bytes)
    await producer.start()
    try:
        for i, value in enumerate(values):  # one partition: one order to keep
            await producer.send(JOBS_EVENTS.name, value, key=str(i).encode(), partition=0)
        await producer.flush()
    finally:
        await producer.stop()
    async with running("fetch", small, setup):
        await _until(lambda: len(seen) >= len(values))
    assert [key for key, _ in seen] == [str(i) for i in range(len(values))]
    assert max(size for _, size in seen) == len(big)
