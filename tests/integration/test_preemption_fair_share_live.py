"""Fair-share preemption in the live preemption service, on real PostgreSQL: a job that holds quota and waits
for room takes the fewest runs (older than the quantum) of a tenant of its cohort far over its fair share,
never one of a tenant within its nominal quota; with it off, or with every run younger than the quantum, it
preempts nobody."""

from __future__ import annotations

from dataclasses import replace

import asyncpg
import pytest

from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from gpusched_core.quota import load_tenancy
from gpusched_core.quota.jobs import queued_job
from services.placement.handlers import process
from services.placement import store as placement
from services.preemption.handlers import consider_all, reconsider
from services.preemption.settings import PreemptionSettings
from services.quota import store as quota_store
from tests.builders import a_job
from tests.integration.test_preemption_reclaim import GPU, NOW, POLICY, STARTED, node, run, submit

A100 = "A100-80GB"
TENANCY = """
version: 1
flavors: [A100-80GB]
priority_classes: {batch: 0}
default_priority_class: batch
fair_share: {half_life_s: 3600}
tenants:
  - name: acme
    children:
      - {name: team-a, quota: {A100-80GB: {nominal: 8}}}
      - {name: team-b, quota: {A100-80GB: {nominal: 8}}}
      - {name: team-c, quota: {A100-80GB: {nominal: 8}}}
"""


async def charged_run(conn: asyncpg.Connection, job_id: str, tenant: str, node_id: str, gpus: tuple[int, ...]) -> None:
    await run(conn, job_id, tenant, A100, [(node_id, gpus)])
    await quota_store.charge(conn, tenant, A100, len(gpus) * GPU)


async def queued(conn: asyncpg.Connection, job_id: str, tenant: str, gpus: int) -> None:
    """A job waiting for quota (in quota's queue)."""
    spec = a_job(job_id).tenant(tenant).gpus(gpus).model(A100).spec()
    await quota_store.queue_job(conn, queued_job(job_id, spec, STARTED.timestamp()))


@pytest.fixture
async def conn(settings):
    """Three nodes of 8 A100s. team-b runs 14 GPUs (n1: b1 4, b2 4; n2: b3 4, b4 2) and waits for 10 more;
    team-c runs 6 (n3: c1 4, c2 2), within its nominal 8; team-a's job a-wait holds 4 GPUs of quota and waits
    for room (n2 and n3 have 2 free each), and team-a waits for 8 more. Entitled 9 / 9 / 6 of the 24: team-a
    at 0.44, team-b at 1.56, team-c at 1.0."""
    connection = await connect(settings.database_url)
    async with connection.transaction():
        await quota_store.install(connection, load_tenancy(TENANCY), TENANCY, source="test", event_id=None,
                                  now=STARTED)
        for node_id in ("n1", "n2", "n3"):
            await process(connection, node(node_id, A100), NOW, POLICY)
        for job_id, tenant, node_id, gpus in (("b1", "team-b", "n1", (0, 1, 2, 3)), ("b2", "team-b", "n1", (4, 5, 6, 7)),
                                              ("b3", "team-b", "n2", (0, 1, 2, 3)), ("b4", "team-b", "n2", (4, 5)),
                                              ("c1", "team-c", "n3", (0, 1, 2, 3)), ("c2", "team-c", "n3", (4, 5))):
            await charged_run(connection, job_id, tenant, node_id, gpus)
        state = await submit(connection, "a-wait", "team-a", 4, A100)
        await append_job_events(connection, state, lifecycle.decide(state, lifecycle.ReserveQuota(4, 8, A100), NOW),
                                producer="test", now=NOW)
        await quota_store.record_reservation(connection, "a-wait", "team-a", A100, 4 * GPU)
        await quota_store.charge(connection, "team-a", A100, 4 * GPU)
        await queued(connection, "a-more", "team-a", 8)
        for i in range(10):
            await queued(connection, f"b-more-{i}", "team-b", 1)
    yield connection
    await connection.close()


async def preempted(conn: asyncpg.Connection) -> dict[str, str]:
    rows = await conn.fetch("SELECT stream_id, payload FROM events WHERE type = 'PreemptionRequested'")
    return {r["stream_id"].removeprefix("job-"): r["payload"]["reason"] for r in rows}


async def test_a_job_waiting_for_room_takes_the_fewest_runs_of_the_tenant_far_over_its_fair_share(conn, settings):
    policy = PreemptionSettings.of(settings).policy()
    async with conn.transaction():
        await consider_all(conn, ["a-wait"], policy, NOW)

    victims = await preempted(conn)
    assert list(victims) == ["b4"], victims  # c2 would make room as well, but team-c is within its nominal quota
    assert victims["b4"].startswith("preempted for job a-wait of priority 0 in tenant team-a, because tenant team-b "
                                    "is above its fair share")
    row = await conn.fetchrow("SELECT outcome, reasons FROM preemption_evaluations WHERE job_id = 'a-wait'")
    assert row["outcome"] == "preempt" and row["reasons"][0].startswith("fair-share preemption: job a-wait")
    assert await conn.fetchval("SELECT count(*) FROM gpu_nominations WHERE job_id = 'a-wait'") == 4


@pytest.mark.parametrize("change", [
    pytest.param({"fair_margin": None}, id="fair-share-preemption-off"),
    pytest.param({"fair_quantum_s": 7200.0}, id="every-run-younger-than-the-quantum"),
])
async def test_nobody_is_preempted_by_fair_share(conn, settings, change):
    policy = replace(PreemptionSettings.of(settings).policy(), **change)
    async with conn.transaction():
        await consider_all(conn, ["a-wait"], policy, NOW)

    assert await preempted(conn) == {}
    assert await conn.fetchval("SELECT outcome FROM preemption_evaluations WHERE job_id = 'a-wait'") == "none"


async def test_a_job_deferred_while_the_runs_were_too_young_is_weighed_again_once_they_are_not(conn, settings):
    """Nothing new happens on the cluster: only the preemption service's pass over the deferred jobs weighs
    a-wait again once team-b's runs are past the quantum; once GPUs are held for it, it is left alone."""
    policy = PreemptionSettings.of(settings).policy()
    async with conn.transaction():  # placement deferred it
        await placement.queue_for_placement(conn, "a-wait", (await load_job(conn, "a-wait")).spec)
        await placement.set_last_reasons_many(conn, [("a-wait", ("no node fits 4 whole GPUs",))])
    async with conn.transaction():  # then, team-b's runs were younger than the quantum
        assert await reconsider(conn, replace(policy, fair_quantum_s=7200.0), NOW) == 1
    assert await preempted(conn) == {}

    async with conn.transaction():
        assert await reconsider(conn, policy, NOW) == 1
    assert list(await preempted(conn)) == ["b4"]
    async with conn.transaction():
        assert await reconsider(conn, policy, NOW) == 0  # GPUs are held for it: nothing more to weigh
    assert list(await preempted(conn)) == ["b4"]
