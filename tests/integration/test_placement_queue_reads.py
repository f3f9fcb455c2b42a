"""Placement's read of its queue (``stores.cluster.pending_jobs``) on real PostgreSQL: inside a transaction (every
cycle) it comes through a cursor a bounded number of rows at a time and gives the same jobs and reasons as a
reader's one-off listing; the values a queue repeats (models, selectors, the reasons jobs of one shape share)
are held once."""

from __future__ import annotations

import pytest

from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.stores import cluster
from gpusched_core.placement.cycle import pending_from_spec
from services.placement import store

NO_ROOM = ("no node has 2 free H100-80GB GPUs (12 nodes)",)
AT_CPU = ("no node has 256000 CPU milli free (4 nodes)", "node selector rack=r1 does not match (8 nodes)")


def _specs(count: int) -> list[ev.JobSpec]:
    shapes = [dict(gpus=2, gpu_model="H100-80GB"), dict(gpus=8, nodes=2, node_selector={"rack": "r1"}),
              dict(gpus=1, gpu_share=ev.GpuShareSpec(milli=250, memory_mib=4096)),
              dict(gpus=1, mig_profile="1g.10gb", gpu_model="A100-80GB", cpu_milli=4000, memory_mib=8192)]
    return [ev.JobSpec(tenant=("team-a", "team-b")[i % 2], priority=(0, 100)[i % 2], command=["true"],
                       **shapes[i % len(shapes)]) for i in range(count)]


@pytest.fixture
async def conn(database_url):
    connection = await connect(database_url)
    yield connection
    await connection.close()


async def _queue(conn, count: int) -> dict[str, ev.JobSpec]:
    specs = {f"job-{i:04d}": spec for i, spec in enumerate(_specs(count))}
    for job_id, spec in specs.items():
        await store.queue_for_placement(conn, job_id, spec)
    return specs


async def test_a_cycle_s_read_in_bounded_chunks_gives_the_jobs_and_reasons_a_reader_sees(conn, monkeypatch):
    specs = await _queue(conn, 23)
    told = {job_id: (NO_ROOM if i % 2 else AT_CPU) for i, job_id in enumerate(list(specs)[:17])}
    await store.set_last_reasons_many(conn, list(told.items()))
    listed, listed_reasons = await cluster.pending_jobs(conn)
    monkeypatch.setattr(cluster, "PENDING_READ_ROWS", 4)  # six chunks
    async with conn.transaction():
        read, reasons = await cluster.pending_jobs(conn)
    assert sorted(read, key=lambda j: j.job_id) == sorted(listed, key=lambda j: j.job_id)
    assert reasons == listed_reasons
    assert len(read) == 23 and len({job.seq for job in read}) == 23
    for job in read:  # every field as queued (its arrival number aside), the reasons as last told
        assert job == pending_from_spec(job.job_id, specs[job.job_id], job.seq, job.submitted_at)
        assert reasons[job.job_id] == (list(told[job.job_id]) if job.job_id in told else None)


async def test_the_values_a_queue_repeats_are_held_once(conn):
    specs = await _queue(conn, 16)
    await store.set_last_reasons_many(conn, [(job_id, NO_ROOM) for job_id in specs])
    for in_transaction in (True, False):
        if in_transaction:
            async with conn.transaction():
                read, reasons = await cluster.pending_jobs(conn)
        else:
            read, reasons = await cluster.pending_jobs(conn)
        assert len(read) == 16 and len({id(r) for r in reasons.values()}) == 1  # one list for all
        for field in ("gpu_model", "mig_profile", "node_selector"):
            values: dict = {}
            for job in read:
                value = getattr(job, field)
                assert values.setdefault(value, value) is value, field  # equal values: one object
        assert {job.node_selector for job in read} == {(), (("rack", "r1"),)}
