"""POST /v1/whatif on real PostgreSQL, the real app connected as the gateway's SELECT-only role: n1 with 8
H100s and the last hour's finished jobs of tenants a and b (b's long 8-GPU run, which a's priority job
preempts in the replay). The answer is the CLI's (``gpusched whatif --json`` over GET /v1/jobs and
/v1/nodes); a tenant admin's replay covers its tenant only; users and viewers may not replay; every bound
(body, policies, tenancy, window size, timeout) is a problem."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpusched_common import db_roles
from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.db_roles import GATEWAY_ROLE
from gpusched_core import placement as engine
from gpusched_core.whatif import replay_jobs, replay_nodes, run_all
from services.gateway import whatif
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.placement.handlers import process
from tests.integration.test_gateway_api import assert_problem, bearer, issue

NOW = datetime.now(UTC)


@pytest.fixture(autouse=True)
def _now_is_when_the_test_runs() -> None:
    """``NOW`` is set again as each test starts: the gateway reads the real clock, and a time taken at
    import is stale by the time a long suite reaches this module."""
    global NOW
    NOW = datetime.now(UTC)
H100 = "H100-80GB"
# job id, tenant, GPUs, priority, submitted (minutes ago), ran (minutes)
JOBS = [("b-long", "b", 8, 10, 50, 40), ("a-high", "a", 4, 100, 45, 5), ("a-1", "a", 1, 10, 30, 2),
        ("a-2", "a", 2, 10, 29, 3), ("b-1", "b", 2, 10, 20, 1), ("b-2", "b", 4, 10, 19, 4)]
STARVE_A = """
version: 1
revision: 1
flavors: [H100-80GB]
tenants:
  - name: a
    quota: {H100-80GB: {nominal: 0, borrowing_limit: 0}}
  - name: b
    quota: {H100-80GB: {nominal: 8}}
"""


async def seed(conn) -> None:
    await process(conn, ev.NodeRegistered(
        node_id="n1", hostname="n1", cpu_milli=64_000, memory_mib=512_000, nvml_backend="simulated", lease_epoch=1,
        gpus=[ev.GpuInventory(index=i, uuid=f"n1-{i}", model=H100, memory_mib=81559) for i in range(8)]),
        NOW, engine.make_policy("bestfit"))
    for job_id, tenant, gpus, priority, ago, ran in JOBS:
        submitted = NOW - timedelta(minutes=ago)
        await conn.execute(
            "INSERT INTO jobs (job_id, tenant, status, version, gpus, gpu_model, priority, submitted_at, started_at,"
            " finished_at, updated_at) VALUES ($1, $2, 'Succeeded', 5, $3, $4, $5, $6, $6, $7, $7)",
            job_id, tenant, gpus, H100, priority, submitted, submitted + timedelta(minutes=ran))
    await conn.execute("INSERT INTO jobs (job_id, tenant, status, version, gpus, submitted_at, updated_at)"
                       " VALUES ('a-waits', 'a', 'Queued', 2, 1, $1, $1)", NOW - timedelta(minutes=5))


@pytest.fixture
async def gateway(database_url: str):
    """(client, tokens by role, the app) over the real app as the gateway's role."""
    admin = await connect(database_url)
    try:
        await seed(admin)
        names = {role: await issue(admin, role, tenant, now=NOW) for role, tenant in
                 (("operator", None), ("tenant-admin", "a"), ("user", "a"), ("viewer", None))}
        password = db_roles.new_password()
        await db_roles.enable_login(admin, GATEWAY_ROLE, password)
    finally:
        await admin.close()
    app = create_app(GatewaySettings(database_url=database_url,
                                     gateway_database_url=db_roles.role_url(database_url, GATEWAY_ROLE, password)))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, names, app


async def post(client, token: str, body: object, status: int = 200) -> dict:
    response = await client.post("/v1/whatif", json=body, headers=bearer(token))
    assert response.status_code == status, response.text
    if status != 200:
        assert response.headers["content-type"].startswith("application/problem+json")
    return response.json()


def without_wall(doc: dict) -> dict:
    return {**doc, "since": None, "runs": {k: {f: v for f, v in r.items() if f != "wall_s"}
                                           for k, r in doc["runs"].items()}}


async def test_an_operator_s_replay_is_what_the_cli_computes_from_the_jobs_and_nodes_it_reads(gateway):
    client, names, _ = gateway
    doc = await post(client, names["operator"], {"since": "1h", "policies": ["bestfit", "ours"]})
    assert (doc["jobs"], doc["left_out"], doc["nodes"], doc["gpus"]) == (6, 1, 1, 8)  # a-waits never ran
    assert list(doc["runs"]) == ["bestfit", "ours"]
    for run in doc["runs"].values():
        assert run["replayed"] == 6 and set(run["tenants"]) == {"a", "b"} and run["wall_s"] >= 0
        assert run["preemptions"] == 1 and run["tenants"]["b"]["preempted"] == 1  # a-high takes b-long's GPUs
        assert run["lost_gpu_hours"] == pytest.approx(8 * (5 * 60 + 30) / 3600)  # 5 min run + the 30 s grace
    # the CLI's way: GET /v1/jobs?since= and GET /v1/nodes, replayed in the caller's process
    rows = (await client.get("/v1/jobs", headers=bearer(names["operator"]),
                             params={"since": doc["since"], "limit": 500})).json()["jobs"]
    nodes = (await client.get("/v1/nodes", headers=bearer(names["operator"]))).json()["nodes"]
    jobs, skipped = replay_jobs(rows)
    runs = run_all(jobs, replay_nodes(nodes), ["bestfit", "ours"], {"": None})
    cli = {"since": None, "jobs": len(jobs), "left_out": skipped, "nodes": 1, "gpus": 8, "runs": runs}
    assert without_wall(doc) == without_wall(cli)


async def test_a_tenant_admin_replays_its_tenant_s_jobs_only_and_users_and_viewers_not_at_all(gateway):
    client, names, _ = gateway
    mine = await post(client, names["tenant-admin"], {"since": "1h", "policies": ["bestfit"]})
    assert mine["jobs"] == 3 and set(mine["runs"]["bestfit"]["tenants"]) == {"a"}
    assert mine["runs"]["bestfit"]["preemptions"] == 0  # b's run is not in a's history
    assert "role tenant-admin" in (await post(client, names["tenant-admin"], {"tenant": "b"}, 403))["detail"]
    for role in ("user", "viewer"):
        assert f"role {role}" in assert_problem(await client.post("/v1/whatif", json={},
                                                                  headers=bearer(names[role])), 403)["detail"]
    narrowed = await post(client, names["operator"], {"since": "1h", "tenant": "b"})
    assert narrowed["jobs"] == 3 and set(narrowed["runs"]["bestfit"]["tenants"]) == {"b"}


async def test_a_tenancy_replays_its_quota(gateway):
    client, names, _ = gateway
    doc = await post(client, names["operator"], {"since": "1h", "policies": ["bestfit"], "tenancy_yaml": STARVE_A})
    run = doc["runs"]["bestfit@tenancy"]
    assert run["tenancy"] == "tenancy" and run["tenants"]["a"]["unschedulable"] == 3
    assert run["tenants"]["b"]["replayed"] == 3 and run["max_quota_overshoot_gpus"] == 0


@pytest.mark.parametrize(("body", "said"), [
    pytest.param({"gpus": 1, "command": ["true"]}, "no what-if request", id="a-job-spec"),
    pytest.param({"policies": ["nope"]}, "unknown policies ['nope']", id="unknown-policy"),
    pytest.param({"policies": ["bestfit", "ours", "fgd", "random"]}, "no what-if request", id="four-policies"),
    pytest.param({"policies": []}, "no what-if request", id="no-policy"),
    pytest.param({"since": "last week"}, "neither a duration", id="since-unreadable"),
    pytest.param({"since": "2099-01-01T00:00:00Z"}, "not in the past", id="since-in-the-future"),
    pytest.param({"tenancy_yaml": "version: 1\ntenants: 7"}, "tenancy_yaml:", id="bad-tenancy"),
    pytest.param([1, 2], "no what-if request", id="not-an-object"),
])
async def test_a_body_that_is_no_what_if_request_is_a_422_with_its_reasons(gateway, body, said):
    client, names, _ = gateway
    problem = await post(client, names["operator"], body, 422)
    assert said in problem["detail"] and problem["reasons"], problem


async def test_unreadable_json_is_a_400(gateway):
    client, names, _ = gateway
    response = await client.post("/v1/whatif", content=b"{", headers={**bearer(names["operator"]),
                                                                      "Content-Type": "application/json"})
    assert response.status_code == 400, response.text


async def test_a_window_of_more_jobs_than_the_bound_is_a_422_saying_so(gateway):
    client, names, app = gateway
    app.state.settings = app.state.settings.model_copy(update={"gateway_whatif_max_jobs": 5})
    problem = await post(client, names["operator"], {"since": "1h"}, 422)
    assert problem["detail"].startswith("7 jobs were submitted since") and "at most 5" in problem["detail"]
    assert (await post(client, names["operator"], {"since": "25m"}))["jobs"] == 2  # b-1, b-2 (a-waits never ran)


async def test_a_replay_past_the_timeout_is_a_504_and_is_told_to_stop(gateway, monkeypatch):
    client, names, app = gateway
    app.state.settings = app.state.settings.model_copy(update={"gateway_whatif_timeout_s": 0.2})
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow(*args, stop, **kw):
        while not stop():
            pass
        loop.call_soon_threadsafe(stopped.set)
        return {}

    monkeypatch.setattr(whatif, "run_all", slow)
    problem = await post(client, names["operator"], {"since": "1h"}, 504)
    assert "longer than 0.2 s" in problem["detail"]
    await asyncio.wait_for(stopped.wait(), 5)
    assert app.state.whatif_running == 0


async def test_one_replay_at_a_time_per_process_by_default(gateway):
    client, names, app = gateway
    app.state.whatif_running = 1  # one in flight
    problem = await post(client, names["operator"], {"since": "1h"}, 503)
    assert "running in this gateway already" in problem["detail"]
