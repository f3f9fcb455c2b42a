"""Two placement processes deciding at once on real PostgreSQL never hand out a GPU twice: the cycle lock
serialises them, and the allocation primary key refuses a double allocation even without it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gpusched_common import decider
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from services.placement import engine
from services.placement.handlers import process
from services.placement.placing import run_cycle
from tests.builders import T0, a_job
from tests.integration.test_placement_leases import registered

POLICY = engine.make_policy("bestfit")


async def reserve(conn, job_id: str, gpus: int):
    spec = a_job(job_id).gpus(gpus).spec()
    state = await load_job(conn, job_id)
    state = await append_job_events(conn, state, decider.decide(state, decider.RegisterSubmission(spec, T0), T0),
                                    producer="test", now=T0)
    events = decider.decide(state, decider.ReserveQuota(gpus, 64), T0)
    await append_job_events(conn, state, events, producer="test", now=T0)
    return events[0]


async def test_two_placers_at_once_never_allocate_a_gpu_twice(database_url):
    setup = await connect(database_url)
    async with setup.transaction():
        await process(setup, registered("n1", gpus=4), T0, POLICY)
    await setup.close()
    first, second = await connect(database_url), await connect(database_url)

    async def placer(conn, job_id: str) -> None:
        async with conn.transaction():
            await process(conn, await reserve(conn, job_id, 3), T0, POLICY)
            await asyncio.sleep(0.2)  # hold the decision open while the other placer runs

    try:
        await asyncio.gather(placer(first, "a"), placer(second, "b"))
        rows = await first.fetch("SELECT job_id, count(*) AS n FROM gpu_allocations GROUP BY job_id")
        assert len(rows) == 1 and rows[0]["n"] == 3  # one of the two got its 3 GPUs; 4 GPUs cannot hold both
        deferred = await first.fetchval("SELECT count(*) FROM events WHERE type = 'PlacementDeferred'")
        assert deferred == 1  # the loser waits, with its reasons
        async with first.transaction():
            await run_cycle(first, T0, POLICY)  # another cycle changes nothing
        assert await first.fetchval("SELECT count(*) FROM gpu_allocations") == 3
    finally:
        await first.close()
        await second.close()


async def test_the_allocation_key_refuses_a_gpu_given_twice(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await process(conn, registered("n1", gpus=1), T0, POLICY)
        await conn.execute("INSERT INTO gpu_allocations VALUES ('n1', 0, 'a', now())")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute("INSERT INTO gpu_allocations VALUES ('n1', 0, 'b', now())")
    finally:
        await conn.close()
