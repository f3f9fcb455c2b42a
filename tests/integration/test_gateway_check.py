"""``POST /v1/jobs:check`` on real PostgreSQL, the real app connected as the gateway's SELECT-only role
(migrations 017 and 033): a node with 8 H100s, 6 of them held by tenant b's low-priority jobs (placed by
placement's own cycle), a tenancy in force; each verdict (start, preempt, wait for capacity, wait for
quota, never), the same body as a submission (JSON or YAML, the same 400/415/422 problems), the same
access rule; and nothing is submitted: no job row, no event, nothing published."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpusched_common import db_roles
from gpusched_common import events as ev
from gpusched_common.db import connect
from gpusched_common.db_roles import GATEWAY_ROLE
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core.quota import load_tenancy
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.placement.handlers import process, run_cycle
from services.placement.store import queue_for_placement
from services.quota import store as quota_store
from tests.builders import a_job
from tests.integration.test_gateway_api import assert_problem, bearer, issue

GPU = 7000  # quota units per GPU
H100 = "H100-80GB"
STARTED = datetime.now(UTC) - timedelta(hours=1)  # past the minimum run time that protects a fresh run


@pytest.fixture(autouse=True)
def _now_is_when_the_test_runs() -> None:
    """``STARTED`` is set again as each test starts: the gateway reads the real clock, and a time taken at
    import is stale by the time a long suite reaches this module."""
    global STARTED
    STARTED = datetime.now(UTC) - timedelta(hours=1)
POLICY = engine.make_policy("bestfit")
TENANCY = """
version: 1
revision: 1
flavors: [H100-80GB]
priority_classes: {high: 100, low: 10}
default_priority_class: low
tenants:
  - name: a
    priority_classes: [high, low]
    quota: {H100-80GB: {nominal: 4}}
  - name: b
    priority_classes: [high, low]
    quota: {H100-80GB: {nominal: 8}}
"""
POD = """
apiVersion: v1
kind: Pod
metadata: {name: two}
spec:
  containers:
    - name: main
      image: registry.example/team/train:1.2
      resources: {limits: {nvidia.com/gpu: 2}}
"""


async def running(conn, job_id: str, tenant: str, gpus: int) -> None:
    """A job of ``tenant`` submitted, reserved, placed by placement's cycle and started an hour ago."""
    spec = a_job(job_id).tenant(tenant).gpus(gpus).model(H100).priority(10).spec()
    state = await load_job(conn, job_id)
    state = await append_job_events(conn, state, lifecycle.decide(
        state, lifecycle.RegisterSubmission(spec, STARTED), STARTED), producer="test", now=STARTED)
    state = await append_job_events(conn, state, lifecycle.decide(
        state, lifecycle.ReserveQuota(gpus, 8, H100), STARTED), producer="test", now=STARTED)
    await quota_store.charge(conn, tenant, H100, gpus * GPU)
    await quota_store.record_reservation(conn, job_id, tenant, H100, gpus * GPU)
    await queue_for_placement(conn, job_id, spec)
    await run_cycle(conn, STARTED, POLICY)
    state = await load_job(conn, job_id)
    assert state.status is lifecycle.JobStatus.PLACED, state.status
    await append_job_events(conn, state, lifecycle.decide(
        state, lifecycle.RecordStart("n1", 1, STARTED), STARTED), producer="test", now=STARTED)


async def reserved(conn, job_id: str, tenant: str, gpus: int) -> None:
    """A job of ``tenant`` that holds quota and waits in placement's queue (no cycle has run since)."""
    spec = a_job(job_id).tenant(tenant).gpus(gpus).model(H100).priority(10).spec()
    state = await load_job(conn, job_id)
    state = await append_job_events(conn, state, lifecycle.decide(
        state, lifecycle.RegisterSubmission(spec, STARTED), STARTED), producer="test", now=STARTED)
    await append_job_events(conn, state, lifecycle.decide(
        state, lifecycle.ReserveQuota(gpus, 8, H100), STARTED), producer="test", now=STARTED)
    await quota_store.charge(conn, tenant, H100, gpus * GPU)
    await quota_store.record_reservation(conn, job_id, tenant, H100, gpus * GPU)
    await queue_for_placement(conn, job_id, spec)


async def seed(conn) -> None:
    await quota_store.install(conn, load_tenancy(TENANCY), TENANCY, source="test", event_id=None, now=STARTED)
    await process(conn, ev.NodeRegistered(
        node_id="n1", hostname="n1", cpu_milli=64_000, memory_mib=512_000, nvml_backend="simulated", lease_epoch=1,
        gpus=[ev.GpuInventory(index=i, uuid=f"n1-{i}", model=H100, memory_mib=81559) for i in range(8)]),
        STARTED, POLICY)
    await running(conn, "b-four", "b", 4)
    await running(conn, "b-two", "b", 2)


@pytest.fixture
async def gateway(database_url: str):
    """(client, tokens by name, what was published, the admin connection) over the real app as its role."""
    admin = await connect(database_url)
    await seed(admin)
    password = db_roles.new_password()
    await db_roles.enable_login(admin, GATEWAY_ROLE, password)
    names = {"user-a": await issue(admin, "user", "a"), "user-b": await issue(admin, "user", "b"),
             "viewer": await issue(admin, "viewer", None), "operator": await issue(admin, "operator", None)}
    app = create_app(GatewaySettings(database_url=database_url,
                                     gateway_database_url=db_roles.role_url(database_url, GATEWAY_ROLE, password)))
    published: list = []
    try:
        async with app.router.lifespan_context(app):
            async def publish(records, **kw) -> None:
                published.append(records)
            app.state.publisher.publish = publish
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
                yield client, names, published, admin
    finally:
        await admin.close()


async def check(client, token: str, body: dict | str, status: int = 200) -> dict:
    kw = {"content": body, "headers": {**bearer(token), "Content-Type": "application/yaml"}} if isinstance(
        body, str) else {"json": body, "headers": bearer(token)}
    response = await client.post("/v1/jobs:check", **kw)
    assert response.status_code == status, response.text
    return response.json()


def job(gpus: int, **fields) -> dict:
    return {"gpus": gpus, "gpu_model": H100, "command": ["true"], **fields}


async def test_a_job_that_fits_would_start_now_on_the_free_gpus(gateway):
    client, names, _, _ = gateway
    answer = await check(client, names["user-a"], job(2))
    assert answer["verdict"] == "start" and answer["summary"] == "would start now on n1 GPUs 6-7", answer
    assert answer["placement"]["node_id"] == "n1" and answer["placement"]["gpu_indices"] == [6, 7]
    assert answer["stages"]["quota"]["ok"] and answer["stages"]["quota"]["used_gpus"] == "0"
    assert answer["victims"] is None and answer["estimated_wait_s"] == 0.0
    assert abs(datetime.fromisoformat(answer["estimated_start"]) - datetime.now(UTC)) < timedelta(minutes=1)


async def test_a_higher_priority_job_would_preempt_the_fewest_lower_priority_jobs(gateway):
    client, names, _, _ = gateway
    answer = await check(client, names["user-a"], job(4, priority_class="high"))
    assert answer["verdict"] == "preempt", answer
    assert answer["summary"].startswith("would start after preempting 1 job (b-two) of lower priority on n1")
    assert [v["job_id"] for v in answer["victims"]] == ["b-two"] and len(answer["placement"]["gpu_indices"]) == 4


async def test_a_job_of_the_same_priority_would_wait_for_capacity(gateway):
    client, names, _, _ = gateway
    answer = await check(client, names["user-a"], job(4))
    assert answer["verdict"] == "wait", answer
    assert answer["summary"] == ("would wait: no free capacity: needs 4 GPUs of H100-80GB on one node, the most "
                                 "free on a node is 2; estimated start in ~60 min")
    # b's runs have no time limit and no past runs: each is given as long again as it has run (an hour)
    assert 3500 < answer["estimated_wait_s"] < 3700 and answer["estimate"]["reason"] == "once a running job ends"
    assert answer["stages"]["preemption"]["outcome"] == "none" and len(answer["reasons"]) > 1


async def test_a_tenant_at_its_quota_would_wait_for_quota_until_its_runs_end(gateway):
    """a runs 2 GPUs and holds quota for 2 more waiting for GPUs: at 4/4 the check waits for quota; once the
    runs end (in an hour: as long again as they have run) its reserved job and then this one start."""
    client, names, _, admin = gateway
    await running(admin, "a-two", "a", 2)
    await reserved(admin, "a-wait", "a", 2)
    answer = await check(client, names["user-a"], job(1))
    assert answer["verdict"] == "wait" and answer["stages"]["quota"]["ok"] is False, answer
    assert answer["summary"] == ("would wait: tenant a at quota (4/4 H100-80GB) and cohort has nothing to lend; "
                                 "estimated start in ~60 min")
    assert 3500 < answer["estimated_wait_s"] < 3700, answer
    assert datetime.fromisoformat(answer["estimated_start"]) > datetime.now(UTC) + timedelta(minutes=55)
    estimates = await client.get("/v1/queue/estimates", headers=bearer(names["user-a"]))
    [waiting] = estimates.json()["jobs"]  # the check submitted nothing: a's own reserved job alone waits
    assert waiting["job_id"] == "a-wait" and abs(waiting["estimated_wait_s"] - answer["estimated_wait_s"]) < 5


@pytest.mark.parametrize(("body", "said"), [
    pytest.param(job(16), "gpus 16 exceeds the limit of 8 GPUs per node", id="too-many-gpus"),
    pytest.param(job(1, gpu_model="Z900-1GB"), "unknown GPU model 'Z900-1GB'", id="unknown-model"),
    pytest.param(job(8), "job needs 8 H100-80GB but tenant a can never hold more than 4", id="over-the-limit"),
])
async def test_what_can_never_run_here_says_why(gateway, body, said):
    client, names, _, _ = gateway
    answer = await check(client, names["user-a"], body)
    assert answer["verdict"] == "never" and answer["summary"].startswith(f"can never run here: {said}"), answer


async def test_a_workload_file_is_checked_like_a_submission(gateway):
    """A pod runs its image in a container: n1 has no container runtime, so it never could here."""
    client, names, _, _ = gateway
    answer = await check(client, names["user-a"], POD)
    assert answer["verdict"] == "never", answer
    assert answer["summary"] == ("can never run here: no node could ever host it: 1 node: no container runtime "
                                 "(the job has an image)")
    assert answer["stages"]["quota"]["ok"] and answer["stages"]["quota"]["gpus"] == "2"


async def test_a_body_that_is_no_job_is_the_problem_a_submission_gets(gateway):
    client, names, _, _ = gateway
    headers = bearer(names["user-a"])
    json_type = {**headers, "Content-Type": "application/json"}
    bad_json = await client.post("/v1/jobs:check", content=b"{", headers=json_type)
    text = await client.post("/v1/jobs:check", content=b"x", headers={**headers, "Content-Type": "text/plain"})
    invalid = await client.post("/v1/jobs:check", json={"gpus": "many", "cmd": ["true"]}, headers=headers)
    for response, status, reasons in ((bad_json, 400, 1), (text, 415, 1), (invalid, 422, 2)):
        assert response.status_code == status, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        assert len(response.json()["reasons"]) == reasons, response.text


async def test_a_user_checks_only_for_its_own_tenant_as_it_submits(gateway):
    client, names, _, _ = gateway
    assert_problem(await client.post("/v1/jobs:check", json={**job(1), "tenant": "b"},
                                     headers=bearer(names["user-a"])), 403)
    assert_problem(await client.post("/v1/jobs:check", json=job(1), headers=bearer(names["viewer"])), 403)
    assert_problem(await client.post("/v1/jobs:check", json=job(1)), 401)
    operator = await check(client, names["operator"], {**job(1), "tenant": "b"})
    assert operator["stages"]["quota"]["tenant"] == "b" and operator["verdict"] == "start"


async def test_a_check_submits_nothing(gateway):
    client, names, published, admin = gateway
    counts = "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM events), (SELECT count(*) FROM outbox)"
    before = tuple(await admin.fetchrow(counts))
    for body in (job(2), job(4, priority_class="high"), job(4), job(16), POD):
        await check(client, names["user-a"], body)
    assert tuple(await admin.fetchrow(counts)) == before and published == []
    assert await admin.fetchval("SELECT count(*) FROM gpu_nominations") == 0
    assert await admin.fetchval("SELECT count(*) FROM placement_pending") == 0
