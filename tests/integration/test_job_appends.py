"""Several jobs' events in one statement, on real PostgreSQL: each stream at its own version, the read model's
rows, the outbox in the order decided and keyed by job; one stale stream and nothing is appended. Deferred to
a batch's end, a batch's decisions are one statement, and a job decided twice in one batch fails the batch."""

from __future__ import annotations

import pytest

from gpusched_common import jobs, store
from gpusched_common.batching import Batch
from gpusched_common.db import connect
from gpusched_core import lifecycle
from tests.builders import T0, a_job


def submitted(state: lifecycle.JobState, tenant: str = "t") -> tuple:
    return lifecycle.decide(state, lifecycle.RegisterSubmission(a_job(state.job_id).tenant(tenant).spec(), T0), T0)


async def test_several_jobs_append_in_one_statement_with_their_read_model_rows_and_outbox(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            blank = [await jobs.load_job(conn, j) for j in ("a", "b", "c")]
            states = await jobs.append_many_job_events(conn, [(s, submitted(s, f"t{i}")) for i, s in enumerate(blank)],
                                                       producer="test", now=T0)
        assert [s.version for s in states] == [2, 2, 2]  # JobSubmitted, JobAdmitted
        for state in states:
            assert (await jobs.load_job(conn, state.job_id)).status is lifecycle.JobStatus.ADMITTED
        rows = await conn.fetch("SELECT job_id, tenant, status, version, reasons, submitted_at FROM jobs ORDER BY 1")
        assert [(r["job_id"], r["tenant"], r["status"], r["version"], r["reasons"]) for r in rows] == [
            ("a", "t0", "Admitted", 2, []), ("b", "t1", "Admitted", 2, []), ("c", "t2", "Admitted", 2, [])]
        assert all(r["submitted_at"] == T0 for r in rows)
        outbox = await conn.fetch("SELECT key, headers->>'event-type' AS type FROM outbox ORDER BY id")
        assert [(r["key"], r["type"]) for r in outbox] == [
            ("a", "JobSubmitted"), ("a", "JobAdmitted"), ("b", "JobSubmitted"), ("b", "JobAdmitted"),
            ("c", "JobSubmitted"), ("c", "JobAdmitted")]
    finally:
        await conn.close()


async def test_one_stale_stream_appends_none_of_them(database_url):
    conn = await connect(database_url)
    try:
        stale = await jobs.load_job(conn, "b")
        await jobs.append_job_events(conn, stale, submitted(stale), producer="test", now=T0)
        fresh = await jobs.load_job(conn, "a")
        with pytest.raises(store.ConcurrencyError):
            async with conn.transaction():
                await jobs.append_many_job_events(conn, [(fresh, submitted(fresh)), (stale, submitted(stale))],
                                                  producer="test", now=T0)
        assert (await jobs.load_job(conn, "a")).version == 0
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 1
    finally:
        await conn.close()


async def test_a_batch_defers_its_appends_to_one_statement_at_its_end(database_url):
    conn = await connect(database_url)
    try:
        async with conn.transaction():
            batch = Batch()
            for job_id in ("a", "b"):
                state = await jobs.load_job(conn, job_id)
                after = jobs.defer_job_events(batch, state, submitted(state), producer="test", now=T0)
                assert after.version == 2
            assert await conn.fetchval("SELECT count(*) FROM events") == 0  # nothing written yet
            await batch.finish(conn)
        assert await conn.fetchval("SELECT count(*) FROM events") == 4
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'Admitted'") == 2
    finally:
        await conn.close()


async def test_a_job_decided_twice_in_one_batch_fails_the_batch(database_url):
    conn = await connect(database_url)
    try:
        with pytest.raises(store.ConcurrencyError):
            async with conn.transaction():
                batch = Batch()
                for _ in range(2):  # the second decision did not see the first
                    state = await jobs.load_job(conn, "a")
                    jobs.defer_job_events(batch, state, submitted(state), producer="test", now=T0)
                await batch.finish(conn)
        assert await conn.fetchval("SELECT count(*) FROM events") == 0
    finally:
        await conn.close()


async def test_a_batch_of_node_reports_reads_the_jobs_they_name_at_its_start(database_url):
    # a start or exit report is keyed by its node; the batch still reads the job it names in its first query
    from gpusched_common import events as ev
    from gpusched_common.batching import apply_batch
    from gpusched_common.db import create_pool
    from gpusched_common.messaging import Incoming, parse_event
    from gpusched_common.topics import NODES_REPORTS

    conn = await connect(database_url)
    try:
        for job_id in ("a", "b"):
            state = await jobs.load_job(conn, job_id)
            await jobs.append_job_events(conn, state, submitted(state), producer="test", now=T0)
    finally:
        await conn.close()
    messages = []
    for offset, job_id in enumerate(("a", "b")):
        report = ev.JobStartReported(job_id=job_id, node_id="n1", pid=10, started_at=T0)
        envelope = ev.make_envelope(report, event_id=f"00000000-0000-4000-8000-00000000000{offset}",
                                    stream_id="node-n1", occurred_at=T0, producer="node-agent")
        message = Incoming(NODES_REPORTS.name, 0, offset, "n1", envelope.model_dump_json().encode(), {})
        parse_event(message)  # as the batch's screen leaves it
        messages.append(message)
    seen: dict[str, int] = {}

    async def handler(c, message, batch) -> None:
        job_id = message.parsed[1].job_id
        cached = store.BATCH_READS.get().streams.get(f"job-{job_id}")
        seen[job_id] = len(cached) if cached is not None else -1

    pool = await create_pool(database_url)
    try:
        await apply_batch(pool, "placement", messages, handler)
    finally:
        await pool.close()
    assert seen == {"a": 2, "b": 2}
