"""Quota gives a batch's released jobs back together at the batch's end (``release_many``), before the
cycles of the cohorts they free, on real PostgreSQL: the order of messages about one job still holds."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest

from gpusched_core import lifecycle
from gpusched_common.batching import Batch
from gpusched_common.db import connect
from gpusched_common.ids import job_stream
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming
from gpusched_common.store import load
from gpusched_core.lifecycle import JobStatus
from gpusched_core.quota import UNITS_PER_GPU
from tests.builders import T0
from tests.integration.test_quota_policy_live import (
    AT_1H,
    events_of,
    handler,
    put_in_force,
    reserved_gpus,
    submit,
    submit_and_deliver,
)

TWO_COHORTS = """
version: 1
flavors: [A100-80GB]
priority_classes: {batch: 100}
default_priority_class: batch
tenants:
  - name: acme
    children:
      - name: team-a
        quota: {A100-80GB: {nominal: 2, borrowing_limit: 2}}
      - name: team-b
        quota: {A100-80GB: {nominal: 4}}
  - name: zeta
    quota: {A100-80GB: {nominal: 2}}
"""


@pytest.fixture
async def conn(database_url):
    connection = await connect(database_url)
    await put_in_force(connection, TWO_COHORTS)
    yield connection
    await connection.close()


async def decide(conn: asyncpg.Connection, job_id: str, *commands: object) -> None:
    async with conn.transaction():
        for command in commands:
            state = await load_job(conn, job_id)
            await append_job_events(conn, state, lifecycle.decide(state, command, T0), producer="test", now=T0)


def preempt(job_id: str) -> tuple[object, ...]:
    return (lifecycle.Place("n1", (0,), ("u0",), "A100-80GB", "firstfit", "fits"),
            lifecycle.RequestPreemption("x", 1000, "team-b", "reclaim", 30.0, T0),
            lifecycle.RecordExit("n1", 0, 10.0))


async def deliver_batch(conn: asyncpg.Connection, messages: list[tuple[str, str]],
                        seen: Callable[[object], None] | None = None) -> None:
    """Each job's latest event of each type, in this order, as one batch in one transaction (``seen``: a
    query logger for the batch's statements)."""
    batch, handle, incoming = Batch(), handler(AT_1H), []
    for offset, (job_id, event_type) in enumerate(messages):
        stored = [s for s in await load(conn, job_stream(job_id)) if s.envelope.type == event_type][-1]
        incoming.append(Incoming("gpusched.jobs.events", 0, offset, job_id,
                                 stored.envelope.model_dump_json().encode(), {}))
    if seen is not None:
        conn.add_query_logger(seen)
    try:
        async with conn.transaction():
            for message in incoming:
                await handle(conn, message, batch)
            await batch.finish(conn)
    finally:
        if seen is not None:
            conn.remove_query_logger(seen)


async def queued(conn: asyncpg.Connection) -> set[str]:
    return {row["job_id"] for row in await conn.fetch("SELECT job_id FROM quota_policy_pending")}


async def test_a_batch_of_releases_in_two_cohorts_gives_back_each_once_and_offers_what_they_freed(conn):
    await submit_and_deliver(conn, "a1", "team-a", 2)
    await submit_and_deliver(conn, "a2", "team-a", 2)  # borrows team-b's idle pair
    await submit_and_deliver(conn, "b1", "team-b", 2)
    await submit_and_deliver(conn, "z1", "zeta", 1)
    await submit_and_deliver(conn, "z2", "zeta", 1)
    await submit_and_deliver(conn, "z3", "zeta", 2)  # waits: zeta at quota
    await submit_and_deliver(conn, "b2", "team-b", 2)  # waits: team-a borrows the cohort's last pair
    assert not await events_of(conn, "z3", "QuotaReserved") and not await events_of(conn, "b2", "QuotaReserved")
    for job_id in ("a1", "a2", "z1", "z2"):
        await decide(conn, job_id, lifecycle.Cancel("test"))

    await deliver_batch(conn, [("a1", "JobCancelled"), ("z1", "JobCancelled"), ("a2", "JobCancelled"),
                               ("z2", "JobCancelled"), ("a1", "JobCancelled")])  # a1's end twice

    # one QuotaReleased each, with what its tenant kept after it, in the batch's order
    assert [e["tenant_reserved_gpus"] for j in ("a1", "a2") for e in await events_of(conn, j, "QuotaReleased")] \
        == [2, 0]
    assert [e["tenant_reserved_gpus"] for j in ("z1", "z2") for e in await events_of(conn, j, "QuotaReleased")] \
        == [1, 0]
    # both cohorts' cycles ran after the releases: what waited got what was freed
    assert len(await events_of(conn, "z3", "QuotaReserved")) == 1
    assert len(await events_of(conn, "b2", "QuotaReserved")) == 1
    assert (await reserved_gpus(conn, "team-a"), await reserved_gpus(conn, "team-b"),
            await reserved_gpus(conn, "zeta")) == (0, 4, 2)
    assert not await conn.fetchval(
        "SELECT count(*) FROM quota_policy_reservations WHERE job_id = ANY($1::text[])", ["a1", "a2", "z1", "z2"])
    assert await queued(conn) == set()


async def test_a_job_held_and_released_in_one_batch_is_in_line_again(conn):
    await submit_and_deliver(conn, "b1", "team-b", 4)
    await submit_and_deliver(conn, "a1", "team-a", 2)  # the cohort's 6 GPUs taken
    await submit_and_deliver(conn, "a2", "team-a", 1)  # waits
    await submit_and_deliver(conn, "a3", "team-a", 1)  # waits too
    await decide(conn, "a2", lifecycle.Hold("test"))
    await decide(conn, "a2", lifecycle.Release())
    assert await queued(conn) == {"a2", "a3"}

    await deliver_batch(conn, [("a2", "JobHeld"), ("a2", "JobReleased")])

    assert (await load_job(conn, "a2")).status is JobStatus.ADMITTED
    assert await queued(conn) == {"a2", "a3"}  # the release left it in line, as the messages' order says


async def test_preempted_jobs_queue_again_unless_they_ended_later_in_the_batch(conn):
    await submit_and_deliver(conn, "b1", "team-b", 1)
    await submit_and_deliver(conn, "b2", "team-b", 1)
    await decide(conn, "b1", *preempt("b1"))
    await decide(conn, "b2", *preempt("b2"))
    await decide(conn, "b2", lifecycle.Cancel("test"))

    await deliver_batch(conn, [("b1", "JobPreempted"), ("b2", "JobPreempted"), ("b2", "JobCancelled")])

    assert [len(await events_of(conn, j, "QuotaReleased")) for j in ("b1", "b2")] == [1, 1]
    assert len(await events_of(conn, "b1", "QuotaReserved")) == 2  # in line again, and its quota free
    assert len(await events_of(conn, "b2", "QuotaReserved")) == 1
    assert (await load_job(conn, "b2")).status is JobStatus.CANCELLED
    assert await reserved_gpus(conn, "team-b") == 1
    assert await conn.fetchval("SELECT sum(reserved_units) FROM quota_policy_usage") == UNITS_PER_GPU


async def test_a_release_of_a_job_admitted_earlier_in_the_batch_takes_it_out_of_line(conn):
    await submit_and_deliver(conn, "b1", "team-b", 4)
    async with conn.transaction():
        await submit(conn, "b2", "team-b", 1)
    await decide(conn, "b2", lifecycle.Cancel("test"))

    await deliver_batch(conn, [("b2", "JobAdmitted"), ("b2", "JobCancelled")])

    assert await queued(conn) == set()
    assert not await events_of(conn, "b2", "QuotaReserved")


async def statements_to_release(conn: asyncpg.Connection, jobs: list[str]) -> int:
    for job_id in jobs:
        await submit_and_deliver(conn, job_id, "team-b", 1)
        await decide(conn, job_id, lifecycle.Cancel("test"))
    seen: list[object] = []
    await deliver_batch(conn, [(job_id, "JobCancelled") for job_id in jobs], seen.append)
    assert [len(await events_of(conn, j, "QuotaReleased")) for j in jobs] == [1] * len(jobs)
    return len(seen)


async def test_a_batch_releases_its_jobs_in_statements_that_do_not_grow_with_each_job(conn):
    one = await statements_to_release(conn, ["b1"])
    four = await statements_to_release(conn, ["b2", "b3", "b4", "b5"])
    # per message: the stored event and the inbox claim; the rest (dependants judged, charges given back,
    # events appended, the cohort's cycle) once per batch
    assert four - one <= 3 * 2, (one, four)
