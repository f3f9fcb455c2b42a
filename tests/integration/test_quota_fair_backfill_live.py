"""Fair backfill in the live quota service, on real PostgreSQL: while a job quota reserved waits in
placement's queue for room on the nodes, quota reserves no job of another tenant of its cohort that would
take that tenant past the share at which the waiting job could preempt it; it says so in the job's stream,
and reserves it once the waiting job is placed. A waiting job no node could ever take holds nobody back."""

from __future__ import annotations

from datetime import datetime, timezone

import asyncpg
import pytest

from gpusched_common.db import connect
from gpusched_common.jobs import load_job
from gpusched_core.quota import load_tenancy
from services.placement import store as placement
from services.quota.handlers import CycleOptions, reserve_for_cohort
from tests.integration.test_quota_policy_live import events_of, put_in_force, reserved_gpus, submit_and_deliver

# pool 16: team-a asks 12 (a 4-GPU job it holds and 8 more), team-b more than 8, so each is entitled to 8;
# team-a at 4/8 = 0.5 lets nobody backfill past 1.5 x 0.5 = 0.75, and team-b holds 10 (1.25)
TENANTS_TEXT = """
version: 1
flavors: [A100-80GB]
priority_classes: {batch: 100}
default_priority_class: batch
fair_share: {half_life_s: 3600}
tenants:
  - name: acme
    priority_classes: [batch]
    children:
      - name: team-a
        quota: {A100-80GB: {nominal: 8}}
      - name: team-b
        quota: {A100-80GB: {nominal: 8}}
"""
TENANTS = load_tenancy(TENANTS_TEXT)
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.fixture
async def conn(database_url):
    connection = await connect(database_url)
    await put_in_force(connection, TENANTS_TEXT)
    yield connection
    await connection.close()


async def a_node(conn: asyncpg.Connection, node_id: str, gpus: int) -> None:
    await conn.execute("INSERT INTO nodes (node_id, hostname, labels, cpu_milli, memory_mib, nvml_backend,"
                       " registered_at, last_seen_at) VALUES ($1, $1, '{}', 64000, 524288, 'simulated', $2, $2)",
                       node_id, NOW)
    await conn.executemany("INSERT INTO gpus (node_id, gpu_index, uuid, model, memory_mib)"
                           " VALUES ($1, $2, $3, 'A100-80GB', 81920)", [(node_id, i, f"{node_id}-{i}") for i in range(gpus)])


async def deferred_by_placement(conn: asyncpg.Connection, job_id: str) -> None:
    """What placement does with a reserved job no node has room for: queue it and record why it waits."""
    async with conn.transaction():
        await placement.queue_for_placement(conn, job_id, (await load_job(conn, job_id)).spec)
        await placement.set_last_reasons_many(conn, [(job_id, ("no node fits 4 whole GPUs: 2 free at most",))])


async def a_cluster_where_team_as_gang_waits_for_room(conn: asyncpg.Connection) -> None:
    for i in range(10):
        await submit_and_deliver(conn, f"b{i}", "team-b", 1)
    await submit_and_deliver(conn, "a-gang", "team-a", 4)
    await deferred_by_placement(conn, "a-gang")
    await submit_and_deliver(conn, "a-next", "team-a", 8)  # waits on quota (2 free): team-a's demand is 12
    assert await reserved_gpus(conn, "team-a") == 4 and await reserved_gpus(conn, "team-b") == 10


async def test_no_tenant_gets_quota_past_the_share_at_which_a_job_waiting_for_room_could_preempt_it(conn):
    await a_node(conn, "n1", 8)
    await a_cluster_where_team_as_gang_waits_for_room(conn)

    await submit_and_deliver(conn, "b-more", "team-b", 1)

    assert await events_of(conn, "b-more", "QuotaReserved") == []
    [deferred] = await events_of(conn, "b-more", "QuotaDeferred")
    assert deferred["reason"] == (
        "fair share: tenant team-b would reach 1.38 of its fair share, past 0.75, while a job of tenant team-a "
        "that fits its quota waits for room on the nodes (no backfill past the share at which that job could "
        "preempt it)")
    assert await reserved_gpus(conn, "team-b") == 10

    async with conn.transaction():  # placement places team-a's job: nothing waits for room any more
        await placement.forget_pending(conn, "a-gang")
        await reserve_for_cohort(conn, TENANTS, "acme", NOW)
    assert len(await events_of(conn, "b-more", "QuotaReserved")) == 1
    assert await reserved_gpus(conn, "team-b") == 11


async def test_a_waiting_job_no_node_could_ever_take_holds_nobody_back(conn):
    await a_node(conn, "n1", 2)  # two GPUs: team-a's 4-GPU job waits for a node that does not exist
    await a_cluster_where_team_as_gang_waits_for_room(conn)

    await submit_and_deliver(conn, "b-more", "team-b", 1)

    assert len(await events_of(conn, "b-more", "QuotaReserved")) == 1


async def test_with_fair_backfill_off_whatever_fits_quota_is_reserved(conn):
    await a_node(conn, "n1", 8)
    await a_cluster_where_team_as_gang_waits_for_room(conn)
    await submit_and_deliver(conn, "b-more", "team-b", 1)  # held back, as above

    async with conn.transaction():
        await reserve_for_cohort(conn, TENANTS, "acme", NOW, CycleOptions(fair_margin=None))

    assert len(await events_of(conn, "b-more", "QuotaReserved")) == 1
