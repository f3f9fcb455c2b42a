"""Paced reservation cycles on real PostgreSQL (``gpusched_common.pacing``): a batch that comes too soon after
its cohort's last cycle queues its jobs, and once it committed the cycle is due; the service's loop runs it
and reserves them. A batch that rolls back leaves nothing due."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from gpusched_common.batching import apply_batch
from gpusched_common.db import connect, create_pool
from gpusched_common.ids import job_stream
from gpusched_common.messaging import Incoming
from gpusched_common.store import load
from gpusched_common.stores.tenancy import TenancyStore
from services.quota.app import due_cycles
from services.quota.handlers import CycleOptions, make_job_event_handler
from gpusched_common.pacing import CyclePacer
from tests.builders import T0
from tests.integration.test_quota_policy_live import events_of, put_in_force, submit


async def admitted(conn, job_id: str) -> Incoming:
    stored = [s for s in await load(conn, job_stream(job_id)) if s.envelope.type == "JobAdmitted"][-1]
    return Incoming("gpusched.jobs.events", 0, 0, job_id, stored.envelope.model_dump_json().encode(), {})


@pytest.fixture
async def db(database_url):
    conn = await connect(database_url)
    await put_in_force(conn)
    pool = await create_pool(database_url)
    yield conn, pool
    await pool.close()
    await conn.close()


def paced_after_a_long_cycle(key: str = "acme") -> CyclePacer:
    pacer = CyclePacer(0.5)
    now = pacer.clock()
    pacer.ran(key, now - 1.0, now)  # a cycle of 1 s just ended: the key's (a cohort's) next one in 1 s
    return pacer


async def test_a_batch_too_soon_queues_its_job_and_the_due_cycle_reserves_it(db):
    conn, pool = db
    pacer = paced_after_a_long_cycle()
    async with conn.transaction():
        await submit(conn, "j1", "team-a", 1)
    await apply_batch(pool, "quota", [await admitted(conn, "j1")], make_job_event_handler(TenancyStore(), lambda: T0,
                                                                                           pacer=pacer))
    assert await conn.fetchval("SELECT count(*) FROM quota_policy_pending WHERE job_id = 'j1'") == 1  # in line
    assert await events_of(conn, "j1", "QuotaReserved") == []  # no cycle in the batch
    assert pacer.wait_s() is not None  # due, once the pause is over
    runtime = SimpleNamespace(pool=pool, wake_relay=lambda: None)
    task = asyncio.create_task(due_cycles(runtime, TenancyStore(), CycleOptions(), pacer))
    try:
        deadline = time.monotonic() + 15
        while not await events_of(conn, "j1", "QuotaReserved"):
            assert time.monotonic() < deadline, "the due cycle never reserved the job"
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    assert await conn.fetchval("SELECT count(*) FROM quota_policy_pending WHERE job_id = 'j1'") == 0
    assert pacer.wait_s() is None


async def test_a_batch_that_rolls_back_leaves_no_cycle_due(db):
    conn, pool = db
    pacer = paced_after_a_long_cycle()
    async with conn.transaction():
        await submit(conn, "j2", "team-a", 1)
    handler = make_job_event_handler(TenancyStore(), lambda: T0, pacer=pacer)

    async def then_fail(connection, message, batch):
        await handler(connection, message, batch)
        await batch.finish(connection)  # the cycle deferred: due after a commit that never comes
        raise RuntimeError("a later message of the batch fails")

    with pytest.raises(RuntimeError):
        await apply_batch(pool, "quota", [await admitted(conn, "j2")], then_fail)
    assert pacer.wait_s() is None
    assert await conn.fetchval("SELECT count(*) FROM quota_policy_pending WHERE job_id = 'j2'") == 0  # rolled back


async def test_a_batch_after_the_pause_runs_its_cycle_itself(db):
    conn, pool = db
    pacer = CyclePacer(0.5)
    async with conn.transaction():
        await submit(conn, "j3", "team-a", 1)
    await apply_batch(pool, "quota", [await admitted(conn, "j3")], make_job_event_handler(TenancyStore(), lambda: T0,
                                                                                           pacer=pacer))
    assert len(await events_of(conn, "j3", "QuotaReserved")) == 1 and pacer.wait_s() is None


async def test_a_cycle_after_a_pause_records_every_queued_job_s_reason_once_a_chunk_at_a_time(db, monkeypatch):
    from services.quota import handlers

    conn, pool = db
    monkeypatch.setattr(handlers, "DEFER_CHUNK", 2)
    pacer = paced_after_a_long_cycle()
    handler = make_job_event_handler(TenancyStore(), lambda: T0, pacer=pacer)
    jobs = [f"w{i}" for i in range(7)]  # team-a: nominal 2, borrowing 2: 4 reserved, 3 wait
    for job_id in jobs:
        async with conn.transaction():
            await submit(conn, job_id, "team-a", 1)
    await apply_batch(pool, "quota", [await admitted(conn, job_id) for job_id in jobs], handler)
    assert all([not await events_of(conn, job_id, "QuotaDeferred") for job_id in jobs])  # no cycle yet
    runtime = SimpleNamespace(pool=pool, wake_relay=lambda: None)
    task = asyncio.create_task(due_cycles(runtime, TenancyStore(), CycleOptions(), pacer))
    try:
        deadline = time.monotonic() + 15
        while await conn.fetchval("SELECT count(*) FROM quota_policy_pending WHERE last_reason IS NOT NULL") < 3:
            assert time.monotonic() < deadline, "the due cycle never recorded the reasons"
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    reserved = [j for j in jobs if await events_of(conn, j, "QuotaReserved")]
    deferred = {j: await events_of(conn, j, "QuotaDeferred") for j in jobs if j not in reserved}
    assert len(reserved) == 4 and len(deferred) == 3
    assert all(len(events) == 1 and "team-a" in events[0]["reason"] for events in deferred.values())
