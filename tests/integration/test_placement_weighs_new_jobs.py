"""Placement weighs only the jobs that came since its last cycle while the cluster stands as that cycle left
it (``ClusterCache.queue_weighed``, migration 037), on real PostgreSQL: the jobs it deferred are not read or
weighed again (they would find no room on a cluster that only holds more), a new job is placed; once anything
else changes the cluster (here a run gives its GPUs back), the whole queue is weighed again."""

from __future__ import annotations

import pytest

from gpusched_common.db import connect
from gpusched_common.jobs import load_job
from gpusched_common.stores import cluster
from gpusched_common.stores.cluster import ClusterCache
from services.placement import handlers, store
from tests.builders import T0
from tests.integration.test_placement_leases import apply, heartbeat, history, queue_job, registered


async def waiting(conn, job_id: str, gpus: int) -> None:
    """Reserved by quota and in placement's queue, as placement's consumer leaves it."""
    await queue_job(conn, job_id, gpus)
    await store.queue_for_placement(conn, job_id, (await load_job(conn, job_id)).spec)


@pytest.fixture
async def db(database_url, monkeypatch):
    """A connection to a store with n1 (4 GPUs), and each queue read of placement's cycles: (only the jobs
    no cycle weighed, the jobs read)."""
    connection = await connect(database_url)
    async with connection.transaction():
        await apply(connection, registered("n1", gpus=4), T0)
        await apply(connection, heartbeat("n1"), T0)
    reads: list[tuple[bool, list[str]]] = []
    read = cluster.pending_jobs

    async def counted(conn, *, unweighed_only=False):
        pending, reasons = await read(conn, unweighed_only=unweighed_only)
        reads.append((unweighed_only, sorted(job.job_id for job in pending)))
        return pending, reasons

    monkeypatch.setattr(handlers, "pending_jobs", counted)
    yield connection, reads
    await connection.close()


async def cycle(conn, cache: ClusterCache) -> None:
    async with conn.transaction():
        await handlers.run_cycle(conn, T0, handlers.engine.make_policy("bestfit"), cache)


async def placed_on(conn, job_id: str) -> list[str | None]:
    return [node for kind, node in await history(conn, job_id) if kind == "JobPlaced"]


async def small_placed_big_deferred(conn) -> ClusterCache:
    """A cycle over the whole queue: a 2-GPU job placed on n1, a 4-GPU one deferred (2 of 4 GPUs free)."""
    cache = ClusterCache()
    async with conn.transaction():
        await waiting(conn, "small", 2)
        await waiting(conn, "big", 4)
    await cycle(conn, cache)
    assert await placed_on(conn, "small") == ["n1"] and await placed_on(conn, "big") == []
    return cache


async def test_while_the_cluster_stands_as_the_last_cycle_left_it_only_new_jobs_are_weighed(db):
    conn, reads = db
    cache = await small_placed_big_deferred(conn)
    reasons = await conn.fetchval("SELECT last_reasons::text FROM placement_pending WHERE job_id = 'big'")
    assert reasons is not None

    async with conn.transaction():
        await waiting(conn, "next", 2)
    await cycle(conn, cache)  # the cluster as the last cycle left it: only the new job is read, and placed
    await cycle(conn, cache)  # nothing new: nothing read but the new jobs (none)
    assert await placed_on(conn, "next") == ["n1"]
    assert reads == [(False, ["big", "small"]), (True, ["next"]), (True, [])]
    assert await conn.fetchval("SELECT last_reasons::text FROM placement_pending WHERE job_id = 'big'") == reasons

    await conn.execute("DELETE FROM gpu_allocations WHERE job_id = ANY($1::text[])", ["small", "next"])  # ended
    await cycle(conn, cache)  # the cluster changed: the whole queue again, and big fits now
    assert reads[-1] == (False, ["big"]) and await placed_on(conn, "big") == ["n1"]


async def test_a_new_cache_or_a_cycle_that_rolled_back_weighs_the_whole_queue(db):
    conn, reads = db
    cache = await small_placed_big_deferred(conn)
    with pytest.raises(RuntimeError):
        async with conn.transaction():
            await waiting(conn, "next", 2)
            await handlers.run_cycle(conn, T0, handlers.engine.make_policy("bestfit"), cache)
            raise RuntimeError("the batch failed after its cycle")
    await cycle(conn, cache)  # the version the rolled-back cycle kept was never committed
    await cycle(conn, ClusterCache())  # another process (or a restart): the whole queue
    assert [full for full, _ in reads] == [False, True, False, False]
    assert await placed_on(conn, "next") == []  # its queueing rolled back with the batch


async def test_a_cycle_over_a_few_jobs_plans_on_the_event_loop_and_over_many_in_a_thread(db, monkeypatch):
    """A few jobs are planned at once on the event loop (a thread's wait for the GIL beside a busy loop cost more
    than their plan); more than ``INLINE_PLAN_JOBS`` in a worker thread, the loop free meanwhile."""
    conn, _reads = db
    threaded: list[int] = []
    to_thread = handlers.asyncio.to_thread

    async def counted(func, snapshot, pending, *args):  # noqa: ANN001, ANN202 - asyncio.to_thread's
        threaded.append(len(pending))
        return await to_thread(func, snapshot, pending, *args)

    monkeypatch.setattr(handlers.asyncio, "to_thread", counted)
    cache = ClusterCache()
    async with conn.transaction():
        await waiting(conn, "few", 1)
    await cycle(conn, cache)
    assert threaded == [] and await placed_on(conn, "few") == ["n1"]
    async with conn.transaction():
        for i in range(handlers.INLINE_PLAN_JOBS + 1):
            await waiting(conn, f"many-{i}", 4)  # none fits beside "few": all deferred
    await cycle(conn, cache)
    assert threaded == [handlers.INLINE_PLAN_JOBS + 1]
