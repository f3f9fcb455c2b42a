"""Paced placement cycles on real PostgreSQL (``gpusched_common.pacing``): a batch that comes too soon after the
last cycle queues its job, and once it committed the cycle is due; the service's loop runs it and places the
job. A batch after the pause places in its own cycle, and a batch that rolls back leaves nothing due."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from gpusched_common.batching import apply_batch
from gpusched_common.db import connect, create_pool
from gpusched_common.ids import job_stream
from gpusched_common.messaging import Incoming
from gpusched_common.pacing import CyclePacer
from gpusched_common.store import load
from gpusched_common.stores.cluster import ClusterCache
from gpusched_common.topics import JOBS_EVENTS
from services.placement.app import due_cycles
from services.placement.handlers import CYCLE_KEY, make_handler
from tests.builders import T0
from tests.integration.test_placement_leases import POLICY, apply, heartbeat, history, queue_job, registered
from tests.integration.test_quota_pacing_live import paced_after_a_long_cycle


async def reserved(conn, job_id: str) -> Incoming:
    """The job's QuotaReserved as placement's consumer gets it."""
    stored = [s for s in await load(conn, job_stream(job_id)) if s.envelope.type == "QuotaReserved"][-1]
    return Incoming(JOBS_EVENTS.name, 0, 0, job_id, stored.envelope.model_dump_json().encode(),
                    {"event-type": "QuotaReserved"})


@pytest.fixture
async def db(database_url):
    conn = await connect(database_url)
    async with conn.transaction():
        await apply(conn, registered("n1", gpus=4), T0)
        await apply(conn, heartbeat("n1"), T0)
    pool = await create_pool(database_url)
    yield conn, pool
    await pool.close()
    await conn.close()


async def placed(conn, job_id: str) -> bool:
    return ("JobPlaced", "n1") in await history(conn, job_id)


async def run_due_until(pool, pacer: CyclePacer, done, what: str) -> None:
    """Placement's due-cycle loop, until ``done()`` (a positive signal from the store) or 15 s."""
    runtime = SimpleNamespace(pool=pool, wake_relay=lambda: None)
    task = asyncio.create_task(due_cycles(runtime, lambda: T0, POLICY, ClusterCache(), pacer))
    try:
        deadline = time.monotonic() + 15
        while not await done():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)
    finally:
        task.cancel()


async def test_a_batch_too_soon_queues_its_job_and_the_due_cycle_places_it(db):
    conn, pool = db
    pacer = paced_after_a_long_cycle(CYCLE_KEY)
    async with conn.transaction():
        await queue_job(conn, "j1", 2)
    await apply_batch(pool, "placement", [await reserved(conn, "j1")],
                      make_handler(lambda: T0, POLICY, ClusterCache(), pacer=pacer))
    assert await conn.fetchval("SELECT count(*) FROM placement_pending WHERE job_id = 'j1'") == 1  # in line
    assert not await placed(conn, "j1")  # no cycle in the batch
    assert pacer.wait_s() is not None  # due, once the pause is over
    await run_due_until(pool, pacer, lambda: placed(conn, "j1"), "the due cycle never placed the job")
    assert await conn.fetchval("SELECT count(*) FROM placement_pending WHERE job_id = 'j1'") == 0
    assert pacer.wait_s() is None


class RecordingPacer(CyclePacer):
    def __init__(self) -> None:
        super().__init__(0.5)
        self.runs: list[str] = []

    def ran(self, key: str, started: float, ended: float) -> None:
        self.runs.append(key)
        super().ran(key, started, ended)


async def test_a_batch_after_the_pause_places_in_its_own_cycle_and_times_it(db):
    conn, pool = db
    pacer = RecordingPacer()
    async with conn.transaction():
        await queue_job(conn, "j2", 2)
    await apply_batch(pool, "placement", [await reserved(conn, "j2")],
                      make_handler(lambda: T0, POLICY, ClusterCache(), pacer=pacer))
    assert await placed(conn, "j2") and pacer.wait_s() is None  # placed by the batch's own cycle: none due
    assert pacer.runs == [CYCLE_KEY]  # the cycle was timed: pacing knows when it ran and how long it took


async def test_a_batch_that_rolls_back_leaves_no_cycle_due(db):
    conn, pool = db
    pacer = paced_after_a_long_cycle(CYCLE_KEY)
    async with conn.transaction():
        await queue_job(conn, "j3", 2)
    handler = make_handler(lambda: T0, POLICY, ClusterCache(), pacer=pacer)

    async def then_fail(connection, message, batch):
        await handler(connection, message, batch)
        raise RuntimeError("the batch fails after its handler deferred the cycle")

    with pytest.raises(RuntimeError):
        await apply_batch(pool, "placement", [await reserved(conn, "j3")], then_fail)
    assert pacer.wait_s() is None
    assert await conn.fetchval("SELECT count(*) FROM placement_pending WHERE job_id = 'j3'") == 0  # rolled back


async def test_a_cycle_records_every_deferral_a_chunk_at_a_time(db, monkeypatch):
    """A paced cycle over a backlog may have thousands of jobs to tell why they wait: it reads and writes their
    streams ``DEFER_CHUNK`` at a time, and every one is told, once."""
    from services.placement import handlers

    conn, pool = db
    monkeypatch.setattr(handlers, "DEFER_CHUNK", 3)
    async with conn.transaction():
        for i in range(7):
            await queue_job(conn, f"big{i}", 8)  # n1 has 4 GPUs: none fits
    pacer = paced_after_a_long_cycle(CYCLE_KEY)  # the batch queues them; the due cycle weighs all seven
    await apply_batch(pool, "placement", [await reserved(conn, f"big{i}") for i in range(7)],
                      make_handler(lambda: T0, POLICY, ClusterCache(), pacer=pacer))
    assert await conn.fetchval("SELECT count(*) FROM placement_pending") == 7
    async def all_told() -> bool:
        return await conn.fetchval("SELECT count(*) FROM events WHERE type = 'PlacementDeferred'") >= 7

    await run_due_until(pool, pacer, all_told, "the cycle did not tell every job why it waits")
    told = await conn.fetch("SELECT stream_id, count(*) AS n FROM events WHERE type = 'PlacementDeferred'"
                            " GROUP BY stream_id")
    assert sorted(r["stream_id"] for r in told) == [f"job-big{i}" for i in range(7)] and {r["n"] for r in told} == {1}
    assert await conn.fetchval("SELECT count(*) FROM placement_pending WHERE last_reasons IS NOT NULL") == 7
