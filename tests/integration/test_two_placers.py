"""Two placement processes deciding at once on real PostgreSQL never hand out a GPU (or a share of one, or a
MIG slice) beyond capacity: the cycle lock serialises them, and PostgreSQL's guards (allocation key,
gpu_usage CHECKs, mig_slices key) refuse an over-allocation even without it."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from gpusched_core import lifecycle
from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import placement as engine
from services.placement.handlers import apply, process
from services.placement.handlers import run_cycle
from gpusched_common.stores.cluster import ClusterCache
from tests.builders import T0, a_job
from tests.integration.test_placement_leases import registered

POLICY = engine.make_policy("bestfit")


async def reserve(conn, job_id: str, gpus: int):
    spec = a_job(job_id).gpus(gpus).spec()
    state = await load_job(conn, job_id)
    state = await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, T0), T0),
                                    producer="test", now=T0)
    events = lifecycle.decide(state, lifecycle.ReserveQuota(gpus, 64), T0)
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


INSERT = ("INSERT INTO gpu_allocations (node_id, gpu_index, job_id, allocated_at, milli, memory_mib, mig_profile,"
          " mig_start, mig_memory_slices) VALUES ('n1', 0, $1, now(), $2, $3, $4, $5, $6)")


@pytest.mark.parametrize(("held", "refused"), [
    pytest.param((1000, 0, None, None, None), (1000, 0, None, None, None), id="whole-then-whole"),
    pytest.param((600, 0, None, None, None), (500, 0, None, None, None), id="shares-beyond-1000-milli"),
    pytest.param((300, 60_000, None, None, None), (300, 30_000, None, None, None), id="shares-beyond-the-memory"),
    pytest.param((300, 0, None, None, None), (1000, 0, None, None, None), id="whole-on-a-shared-gpu"),
    pytest.param((500, 0, "3g.40gb", 0, 4), (250, 0, "2g.20gb", 2, 2), id="overlapping-mig-slices"),
    pytest.param((125, 0, "1g.10gb", 0, 1), (1000, 0, None, None, None), id="whole-on-a-gpu-with-a-mig-slice"),
])
async def test_postgresql_refuses_any_allocation_beyond_a_gpu(database_url, held, refused):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await process(conn, registered("n1", gpus=1), T0, POLICY)
        await conn.execute(INSERT, "a", *held)
        with pytest.raises(asyncpg.IntegrityConstraintViolationError):
            await conn.execute(INSERT, "b", *refused)
        await conn.execute("DELETE FROM gpu_allocations WHERE job_id = 'a'")
        await conn.execute(INSERT, "b", *refused)  # released capacity is usable again
        assert await conn.fetchval("SELECT milli FROM gpu_usage") == refused[0]
    finally:
        await conn.close()


async def test_shares_and_mig_slices_that_fit_together_are_allowed(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            await process(conn, registered("n1", gpus=1), T0, POLICY)
        await conn.execute(INSERT, "a", 500, 0, "3g.40gb", 0, 4)
        await conn.execute(INSERT, "b", 250, 0, "2g.20gb", 4, 2)
        await conn.execute(INSERT, "c", 125, 0, "1g.10gb", 6, 1)
        assert await conn.fetchval("SELECT count(*) FROM mig_slices") == 7
    finally:
        await conn.close()


async def test_two_placers_at_once_never_share_a_gpu_beyond_it(database_url):
    """Bypassing the cycle lock on purpose: both decide on the same free GPU; PostgreSQL lets one commit."""
    setup = await connect(database_url)
    async with setup.transaction():
        await process(setup, registered("n1", gpus=1), T0, POLICY)
    await setup.close()
    first, second = await connect(database_url), await connect(database_url)

    async def claim(conn, job_id: str) -> bool:
        try:
            async with conn.transaction():
                await conn.execute(INSERT, job_id, 600, 0, None, None, None)
                await asyncio.sleep(0.2)
            return True
        except asyncpg.IntegrityConstraintViolationError:
            return False

    try:
        outcomes = await asyncio.gather(claim(first, "a"), claim(second, "b"))
        assert sorted(outcomes) == [False, True]
        assert await first.fetchval("SELECT milli FROM gpu_usage") == 600
    finally:
        await first.close()
        await second.close()


async def test_a_placer_keeps_its_snapshot_until_someone_else_changes_the_cluster(database_url):
    conn = await connect(database_url)
    cache = ClusterCache()
    try:
        async with conn.transaction():
            await process(conn, registered("n1", gpus=2), T0, POLICY)
        for job_id in ("a", "b"):
            async with conn.transaction():
                await apply(conn, await reserve(conn, job_id, 1), T0)
                await run_cycle(conn, T0, POLICY, cache)
        assert (cache.loads, cache.hits) == (1, 1)  # the second cycle placed onto the first one's snapshot
        async with conn.transaction():  # another writer (here: a test, holding the cycle lock) frees a GPU
            await conn.execute("SELECT pg_advisory_xact_lock($1)", 727_100)
            await conn.execute("DELETE FROM gpu_allocations WHERE job_id = 'a'")
        async with conn.transaction():
            await apply(conn, await reserve(conn, "c", 1), T0)
            await run_cycle(conn, T0, POLICY, cache)
        assert cache.loads == 2  # the change was seen, and the freed GPU used
        rows = await conn.fetch("SELECT job_id FROM gpu_allocations ORDER BY job_id")
        assert [r["job_id"] for r in rows] == ["b", "c"]
        with pytest.raises(RuntimeError):  # a cycle whose transaction rolls back leaves no usable cache
            async with conn.transaction():
                await conn.execute("DELETE FROM gpu_allocations WHERE job_id = 'b'")
                await apply(conn, await reserve(conn, "d", 2), T0)
                await run_cycle(conn, T0, POLICY, cache)
                raise RuntimeError("roll back")
        async with conn.transaction():
            await apply(conn, await reserve(conn, "e", 1), T0)
            await run_cycle(conn, T0, POLICY, cache)
        assert cache.loads == 4  # the rolled-back cycle loaded once, and its snapshot was not trusted after
        assert await conn.fetchval("SELECT count(*) FROM gpu_allocations") == 2  # b and c: nothing left for e
    finally:
        await conn.close()
