"""A job in placement's queue is one that waits for GPUs, on real PostgreSQL: a reservation handled while
another transaction places the same job (the store's pass queued it first, its message came late) does not
put it back in the queue; and a queued job that holds GPUs already does not stop a cycle placing the others.

Found in `gpusched bench-scale` (1,000 nodes, a burst of 3,000 jobs): placement lagged more than the
recovery pass's 10 s behind quota, the pass queued the reserved jobs from the store, a cycle placed one of
them while the job's own QuotaReserved was being handled on the other connection, and that handler, which
had read the job as still Queued, queued it again. Every cycle after that failed on the job's allocation
(``allocation ... already exists``): batches split down to single messages, and reservations were
dead-lettered, until the pass forgot the row 10-20 s later."""

from __future__ import annotations

import asyncio

import pytest

from gpusched_common import store as event_store
from gpusched_common.batching import Batch, apply_batch
from gpusched_common.db import connect, create_pool
from gpusched_common.ids import job_stream
from gpusched_common.jobs import load_job
from gpusched_common.messaging import Incoming
from gpusched_common.pacing import CyclePacer
from gpusched_common.store import BATCH_READS, read_for_batch
from gpusched_common.topics import JOBS_EVENTS
from gpusched_common.stores.cluster import ClusterCache
from gpusched_core.lifecycle import JobStatus
from services.placement import handlers, store
from tests.builders import T0
from tests.integration.test_placement_leases import apply, heartbeat, history, queue_job, registered

POLICY = handlers.engine.make_policy("bestfit")


@pytest.fixture
async def two(database_url):
    """Two connections to a store with n1 (4 GPUs, its lease)."""
    first, second = await connect(database_url), await connect(database_url)
    async with first.transaction():
        await apply(first, registered("n1", gpus=4), T0)
        await apply(first, heartbeat("n1"), T0)
    yield first, second
    await first.close()
    await second.close()


async def pending(conn) -> list[str]:
    return [r["job_id"] for r in await conn.fetch("SELECT job_id FROM placement_pending ORDER BY job_id")]


async def waits_on_a_lock(conn, other) -> None:
    """Until ``other``'s backend waits on a lock (a positive signal that it got that far)."""
    pid = other.get_server_pid()
    for _ in range(500):
        if await conn.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the other transaction never waited on a lock")


async def test_a_reservation_handled_while_a_cycle_places_its_job_does_not_queue_it_again(two):
    placer, consumer = two
    async with placer.transaction():
        reserved = await queue_job(placer, "x", 2)
        await store.queue_for_placement(placer, "x", (await load_job(placer, "x")).spec)  # the store's pass
    placing = placer.transaction()
    await placing.start()
    await handlers.run_cycle(placer, T0, POLICY, ClusterCache())  # places x, not committed yet
    handling = consumer.transaction()
    await handling.start()
    # x's own QuotaReserved, late, in a batch that read x's stream at its start (x still Queued then)
    token = BATCH_READS.set(await read_for_batch(consumer, store.SERVICE, [], [job_stream("x")]))
    try:
        late = asyncio.create_task(handlers.apply(consumer, reserved, T0))
    finally:
        BATCH_READS.reset(token)
    await waits_on_a_lock(placer, consumer)
    await placing.commit()
    assert await late is False  # placed already: nothing queued, no cycle needed
    await handling.commit()

    assert (await load_job(placer, "x")).status is JobStatus.PLACED
    assert await pending(placer) == []
    assert [node for kind, node in await history(placer, "x") if kind == "JobPlaced"] == ["n1"]


async def test_a_queued_job_that_holds_gpus_already_does_not_stop_the_cycle(two):
    conn, _ = two
    async with conn.transaction():
        await store.queue_for_placement(conn, "x", (await queue_job(conn, "x", 2)).spec)
        await handlers.run_cycle(conn, T0, POLICY, ClusterCache())
    assert not await store.queue_if_waiting(conn, "x", (await load_job(conn, "x")).spec)  # placed: refused
    async with conn.transaction():  # x queued again, as the race above did: its row and its GPUs disagree
        await store.queue_for_placement(conn, "x", (await load_job(conn, "x")).spec)
        await store.queue_for_placement(conn, "y", (await queue_job(conn, "y", 2)).spec)
    assert await pending(conn) == ["x", "y"]

    for cache in (ClusterCache(), None):  # a cached cluster or one loaded from the store
        async with conn.transaction():
            await handlers.run_cycle(conn, T0, POLICY, cache)
    assert await pending(conn) == []  # y placed, x's stray row forgotten
    assert [node for kind, node in await history(conn, "y") if kind == "JobPlaced"] == ["n1"]
    assert [node for kind, node in await history(conn, "x") if kind == "JobPlaced"] == ["n1"]  # once
    held = await conn.fetch("SELECT job_id, count(*) AS n FROM gpu_allocations GROUP BY job_id ORDER BY job_id")
    assert [(r["job_id"], r["n"]) for r in held] == [("x", 2), ("y", 2)]


def as_message(stored, offset: int) -> Incoming:
    envelope = stored.envelope
    return Incoming(JOBS_EVENTS.name, 0, offset, envelope.stream_id.removeprefix("job-"),
                    envelope.model_dump_json().encode(), {"event-type": envelope.type})


async def reservation_of(conn, job_id: str):
    return next(e for e in await event_store.load(conn, job_stream(job_id)) if e.envelope.type == "QuotaReserved")


async def test_a_batch_queues_its_reservations_together_under_the_lock_and_the_store_decides(two, caplog):
    """A batch of reservations queues its jobs in one statement at its end, before its cycle: a job a cycle
    on another connection placed after the batch read it (the batch's early read says Queued) is not queued
    again; the others are queued in the order of their messages and placed."""
    placer, consumer = two
    async with placer.transaction():
        for job_id in ("a", "b", "c"):
            await queue_job(placer, job_id, 1)
        await store.queue_for_placement(placer, "c", (await load_job(placer, "c")).spec)  # the store's pass
    reservations = [await reservation_of(placer, job_id) for job_id in ("a", "b", "c")]
    messages = [as_message(stored, i) for i, stored in enumerate(reservations)]
    handler = handlers.make_handler(lambda: T0, POLICY, ClusterCache(), accept_unsigned=True)
    batch = Batch(tuple(messages))
    async with consumer.transaction():
        token = BATCH_READS.set(await read_for_batch(consumer, store.SERVICE, [r.envelope.event_id for r in reservations],
                                                     [job_stream(j) for j in ("a", "b", "c")]))
        try:
            for message in messages:
                await handler(consumer, message, batch)
            assert await pending(placer) == ["c"]  # nothing written yet: the batch queues at its end
            async with placer.transaction():
                await handlers.run_cycle(placer, T0, POLICY, ClusterCache())  # c placed meanwhile
            await batch.finish(consumer)
        finally:
            BATCH_READS.reset(token)
    assert await pending(placer) == []
    assert "hold GPUs already" not in caplog.text  # c was never queued again (not merely forgotten by the cycle)
    for job_id in ("a", "b", "c"):
        assert [node for kind, node in await history(placer, job_id) if kind == "JobPlaced"] == ["n1"], job_id


async def test_jobs_queued_together_keep_their_order_and_only_waiting_ones_go_in(two):
    conn, _ = two
    async with conn.transaction():
        for job_id in ("p", "q", "r"):
            await queue_job(conn, job_id, 1)
        specs = {j: (await load_job(conn, j)).spec for j in ("p", "q", "r")}
        specs["s"] = specs["p"]
        await conn.execute("UPDATE jobs SET status = 'Held' WHERE job_id = 'q'")  # waits for no GPUs now
        queued = await store.queue_many_if_waiting(conn, [(j, specs[j]) for j in ("r", "q", "s", "p")])
        again = await store.queue_many_if_waiting(conn, [("p", specs["p"])])
    assert queued == ["r", "p"] and again == []  # s: the store has no such job
    order = await conn.fetch("SELECT job_id FROM placement_pending ORDER BY seq")
    assert [r["job_id"] for r in order] == ["r", "p"]


async def test_a_cycle_that_fails_at_a_batch_s_end_costs_the_batch_none_of_its_messages(two, database_url,
                                                                                         monkeypatch):
    """The batch's reservation is queued and its claim written though its cycle failed (rolled back to its
    savepoint); the cycle is left due, and the due cycle places the job."""
    conn, _ = two
    async with conn.transaction():
        await queue_job(conn, "a", 1)
    stored = await reservation_of(conn, "a")
    pacer = CyclePacer(share=1.0)
    handler = handlers.make_handler(lambda: T0, POLICY, ClusterCache(), accept_unsigned=True, pacer=pacer)
    real = handlers.run_cycle

    async def failing(conn, *args, **kwargs):
        await conn.execute("UPDATE nodes SET cordoned_at = now()")  # a write the rollback must undo
        raise RuntimeError("a bug in the plan")

    monkeypatch.setattr(handlers, "run_cycle", failing)
    pool = await create_pool(database_url)
    try:
        await apply_batch(pool, store.SERVICE, [as_message(stored, 0)], handler)  # the consumers' own path
    finally:
        await pool.close()
    assert await pending(conn) == ["a"]
    assert await conn.fetchval("SELECT count(*) FROM inbox WHERE consumer = 'placement' AND event_id = $1",
                               stored.envelope.event_id) == 1
    assert await conn.fetchval("SELECT count(*) FROM nodes WHERE cordoned_at IS NOT NULL") == 0
    assert pacer.wait_s() is not None  # the cycle is due again
    monkeypatch.setattr(handlers, "run_cycle", real)
    async with conn.transaction():
        await handlers.run_cycle(conn, T0, POLICY, ClusterCache())
    assert [node for kind, node in await history(conn, "a") if kind == "JobPlaced"] == ["n1"]

