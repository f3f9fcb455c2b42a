"""Quota's read of a cohort's queue (``stores.quota.load_queued``) on real PostgreSQL: inside a transaction (every
cycle) it comes through a cursor a bounded number of rows at a time, and gives the same jobs as a reader's
one-off listing; the strings a queue repeats are held once."""

from __future__ import annotations

import pytest

from gpusched_common.db import connect
from gpusched_common.stores import quota as reads
from gpusched_core.quota.jobs import QueuedJob
from services.quota import store


def _jobs(count: int) -> list[QueuedJob]:
    shapes = [dict(gpus=1, gpu_model="H100-80GB"), dict(gpus=8, gpu_model=None, nodes=2),
              dict(gpus=1, gpu_model=None, share_milli=250), dict(gpus=1, mig_profile="1g.10gb", gpu_model="A100-80GB")]
    return [QueuedJob(f"job-{i:04d}", ("team-a", "team-b", "guest")[i % 3], priority=(0, 100)[i % 2],
                      queued_at_s=1_700_000_000.0 + i, **shapes[i % len(shapes)]) for i in range(count)]


@pytest.fixture
async def conn(database_url):
    connection = await connect(database_url)
    yield connection
    await connection.close()


async def test_a_cycle_s_read_in_bounded_chunks_gives_the_jobs_a_reader_sees(conn, monkeypatch):
    jobs = _jobs(23)
    await store.queue_jobs(conn, [(job, None) for job in jobs])
    reasons = [(job.job_id, f"tenant {job.tenant} at its limit (2/2 H100-80GB); job needs 1") for job in jobs[:17]]
    await store.set_last_reasons(conn, reasons, 1_700_000_100.0)
    listed = await reads.load_queued(conn, ("team-a", "team-b"), all_known=("team-a", "team-b"))  # guests too
    monkeypatch.setattr(reads, "QUEUE_READ_ROWS", 4)  # six chunks
    async with conn.transaction():
        read = await reads.load_queued(conn, ("team-a", "team-b"), all_known=("team-a", "team-b"))
    assert sorted(read, key=lambda j: j.job_id) == sorted(listed, key=lambda j: j.job_id)
    by_id = {job.job_id: job for job in read}
    assert len(by_id) == 23
    expected = {job.job_id: job for job in jobs}
    for job_id, job in by_id.items():  # every field as queued, the reason as recorded
        reason = dict(reasons).get(job_id)
        assert job == QueuedJob(**{**{f: getattr(expected[job_id], f) for f in QueuedJob.__dataclass_fields__},
                                   "last_reason": reason, "last_reason_at_s": 1_700_000_100.0 if reason else None})
    async with conn.transaction():  # a tenant's own jobs only, without guests
        assert {job.job_id for job in await reads.load_queued(conn, ("team-b",))} == {
            job.job_id for job in jobs if job.tenant == "team-b"}


async def test_the_strings_and_times_a_queue_repeats_are_held_once(conn):
    jobs = _jobs(12)
    await store.queue_jobs(conn, [(job, None) for job in jobs])
    await store.set_last_reasons(conn, [(job.job_id, "tenant team-a at its limit") for job in jobs], 1_700_000_100.0)
    for in_transaction in (True, False):
        if in_transaction:
            async with conn.transaction():
                read = await reads.load_queued(conn, ("team-a", "team-b", "guest"))
        else:
            read = await reads.load_queued(conn, ("team-a", "team-b", "guest"))
        assert len(read) == 12
        for field in ("tenant", "gpu_model", "last_reason", "last_reason_at_s", "mig_profile"):
            values = {}
            for job in read:
                value = getattr(job, field)
                assert values.setdefault(value, value) is value, field  # equal values: one object
        assert len({id(job.job_id) for job in read}) == 12
