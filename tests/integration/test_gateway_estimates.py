"""GET /v1/queue/estimates on real PostgreSQL, driving the real gateway app: a node full until its run's time
limit, jobs waiting behind it (one with a time limit, one estimated from its tenant's finished runs, one that
can never fit), each reader seeing what GET /v1/queue lets it see."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpusched_common.db import connect
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.placement.store import queue_for_placement
from tests.builders import a_job
from tests.integration.test_dashboard_api import allocate, register
from tests.integration.test_gateway_api import assert_problem, bearer, issue

NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture(autouse=True)
def _now_is_when_the_test_runs() -> None:
    """``NOW`` is set again as each test starts: the gateway reads the real clock, and a time taken at
    import is stale by the time a long suite reaches this module."""
    global NOW
    NOW = datetime.now(UTC).replace(microsecond=0)
H100 = "H100-80GB"


async def submit(conn, job_id: str, tenant: str, gpus: int, time_limit_s: float | None = None) -> None:
    spec = a_job(job_id).tenant(tenant).gpus(gpus).spec().model_copy(update={"time_limit_s": time_limit_s})
    state = await load_job(conn, job_id)
    await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, NOW), NOW),
                            producer="test", now=NOW)
    await queue_for_placement(conn, job_id, spec)


async def seed(conn) -> None:
    """n1: 8 H100s, all held by a's run-a (started 100 s ago, a 600 s limit); waiting: w-a (4 GPUs, a 300 s
    limit), w-b (8 GPUs, no limit; b ran three such jobs of 100, 200 and 900 s), w-big (16 GPUs: never)."""
    await register(conn, "n1", 8)
    await submit(conn, "run-a", "a", 8, 600.0)
    await conn.execute("DELETE FROM placement_pending WHERE job_id = 'run-a'")
    await conn.execute("UPDATE jobs SET status = 'Running', started_at = $1 WHERE job_id = 'run-a'",
                       NOW - timedelta(seconds=100))
    for i in range(8):
        await allocate(conn, "n1", i, "run-a")
    await submit(conn, "w-a", "a", 4, 300.0)
    await submit(conn, "w-b", "b", 8)
    await submit(conn, "w-big", "a", 16)
    for i, runtime_s in enumerate((100, 200, 900)):
        end = NOW - timedelta(hours=1)
        await conn.execute("INSERT INTO jobs (job_id, tenant, status, version, gpus, submitted_at, started_at,"
                           " finished_at, updated_at) VALUES ($1, 'b', 'Succeeded', 5, 8, $2, $2, $3, $3)",
                           f"done-b-{i}", end - timedelta(seconds=runtime_s), end)


@pytest.fixture
async def gateway(database_url: str):
    conn = await connect(database_url)
    try:
        await seed(conn)
        names = {role: await issue(conn, role, tenant, now=NOW) for role, tenant in
                 (("operator", None), ("viewer", None), ("user", "a"))}
    finally:
        await conn.close()
    app = create_app(GatewaySettings(database_url=database_url))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, names


async def estimates(client, names, role: str, **params) -> dict:
    response = await client.get("/v1/queue/estimates", headers=bearer(names[role]), params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def test_each_waiting_job_starts_when_the_runs_ahead_of_it_end(gateway):
    client, names = gateway
    doc = await estimates(client, names, "operator")
    assert doc["tenant"] is None and datetime.fromisoformat(doc["as_of"]) >= NOW
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert set(jobs) == {"w-a", "w-b", "w-big"}
    late = (datetime.fromisoformat(doc["as_of"]) - NOW).total_seconds()
    w_a, w_b, big = jobs["w-a"], jobs["w-b"], jobs["w-big"]
    assert w_a["estimated_wait_s"] == pytest.approx(500 - late, abs=1)  # run-a's limit ends it
    assert (w_a["runtime_source"], w_a["after_job"], w_a["tenant"], w_a["queue"]) == ("time limit", "run-a", "a",
                                                                                        "capacity")
    assert w_b["estimated_wait_s"] == pytest.approx(800 - late, abs=1)  # then w-a's 300 s
    assert (w_b["runtime_source"], w_b["runtime_s"], w_b["after_job"]) == ("tenant median of 3 runs", 200.0, "w-a")
    start = datetime.fromisoformat(w_b["estimated_start"])
    assert start == datetime.fromisoformat(doc["as_of"]) + timedelta(seconds=w_b["estimated_wait_s"])
    assert (big["estimated_start"], big["estimated_wait_s"]) == (None, None) and big["reason"].startswith("never")


async def test_a_user_sees_its_tenant_s_estimates_and_a_viewer_no_job_details(gateway):
    client, names = gateway
    mine = (await estimates(client, names, "user"))["jobs"]
    assert sorted(j["job_id"] for j in mine) == ["w-a", "w-big"] and all(j["tenant"] == "a" for j in mine)
    assert next(j for j in mine if j["job_id"] == "w-a")["after_job"] == "run-a"  # a's own run
    assert_problem(await client.get("/v1/queue/estimates", headers=bearer(names["user"]), params={"tenant": "b"}), 403)
    seen = (await estimates(client, names, "viewer"))["jobs"]
    assert {j["job_id"] for j in seen} == {"w-a", "w-b", "w-big"}
    assert all(set(j) == {"job_id", "position", "estimated_start", "estimated_wait_s", "runtime_source", "reason"}
               for j in seen)
