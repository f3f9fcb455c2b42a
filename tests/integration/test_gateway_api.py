"""The gateway's read API on real PostgreSQL, driving the real app (its lifespan and pool included):
bearer tokens and each kind of refusal, the route x role matrix generated from the access rule table,
tenant scoping (another tenant's job is the same 404 as a missing one), pagination, problem details; and
one run of the real process."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from gpusched_common import events as ev
from gpusched_common import tokens
from gpusched_common.db import connect
from gpusched_common.infra.processes import free_port, spawn, stop_pid, wait_for_port
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core.access import RULES, Action, Role, Scope
from services.gateway.auth import ACTION_KEY
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.placement.handlers import process
from tests.builders import T0, a_job

ROOT = Path(__file__).resolve().parents[2]
JOBS = {"a": [f"a-{i:02d}" for i in range(7)], "b": [f"b-{i:02d}" for i in range(3)]}
PROBLEM_FIELDS = {"type", "title", "status", "detail"}


async def seed(conn) -> None:
    """Jobs of tenants a and b, some submitted at the same instant (the cursor's tie-break), and a node."""
    for tenant, ids in JOBS.items():
        for i, job_id in enumerate(ids):
            at = T0 + timedelta(seconds=i // 2)
            state = await load_job(conn, job_id)
            spec = a_job(job_id).tenant(tenant).spec()
            await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, at), at),
                                    producer="test", now=at)
    await process(conn, ev.NodeRegistered(
        node_id="n1", hostname="n1", cpu_milli=16_000, memory_mib=65_536, nvml_backend="simulated", lease_epoch=1,
        gpus=[ev.GpuInventory(index=i, uuid=f"n1-{i}", model="H100-80GB", memory_mib=81559) for i in range(2)]),
        T0, engine.make_policy("bestfit"))


async def issue(conn, role: str, tenant: str | None, **kw) -> str:
    text, _ = await tokens.issue(conn, role=role, tenant=tenant, name=kw.get("name"), created_by="test",
                                 expires_at=kw.get("expires_at"), now=kw.get("now", T0))
    return text


@pytest.fixture
async def gateway(database_url: str):
    """(client, app, tokens by name) over the real app with its lifespan run."""
    conn = await connect(database_url)
    try:
        await seed(conn)
        now = T0.replace(year=2020)  # issued long ago, for the expired one
        names = {"user": await issue(conn, "user", "a"), "tenant-admin": await issue(conn, "tenant-admin", "a"),
                 "viewer": await issue(conn, "viewer", None), "operator": await issue(conn, "operator", None),
                 "expired": await issue(conn, "user", "a", now=now, expires_at=now + timedelta(days=1)),
                 "revoked": await issue(conn, "user", "a")}
        await tokens.revoke(conn, tokens.parse_token(names["revoked"]), T0)
    finally:
        await conn.close()
    app = create_app(GatewaySettings(database_url=database_url))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, app, names


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert set(body) == PROBLEM_FIELDS and body["status"] == status and body["detail"]
    return body


async def test_health_readiness_and_the_documents_need_no_token(gateway):
    client, _, _ = gateway
    assert (await client.get("/healthz")).status_code == 200
    assert (await client.get("/readyz")).json() == {"status": "ready", "submissions": "off: no producer key"}
    assert "/v1/jobs" in (await client.get("/openapi.json")).json()["paths"]
    assert (await client.get("/docs")).status_code == 200


async def test_readiness_is_a_503_problem_when_the_database_is_unreachable():
    app = create_app(GatewaySettings(database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/none"))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            assert_problem(await client.get("/readyz"), 503)
            assert (await client.get("/healthz")).status_code == 200


async def test_each_refused_credential_is_a_401_problem_counted_by_reason_and_never_echoed(gateway):
    client, _, names = gateway
    cases = [("missing", {}, "no credentials"), ("malformed", {"Authorization": "Basic dXNlcjpwdw=="}, "Bearer"),
             ("malformed", bearer("not-a-token"), "malformed"),
             ("unknown", bearer("gst_0123456789abcdef_" + "x" * 43), "unknown"),
             ("expired", bearer(names["expired"]), "expired"), ("revoked", bearer(names["revoked"]), "revoked")]
    for reason, headers, said in cases:
        response = await client.get("/v1/jobs", headers=headers)
        assert said in assert_problem(response, 401)["detail"], reason
        assert response.headers["www-authenticate"].startswith("Bearer"), reason
        assert all(t not in response.text for t in names.values()), reason
    metrics = (await client.get("/metrics")).text
    for reason, n in {"missing": 1, "malformed": 2, "unknown": 1, "expired": 1, "revoked": 1}.items():
        assert f'gpusched_gateway_auth_failures_total{{reason="{reason}"}} {n}' in metrics


async def test_every_route_refuses_every_bad_credential_with_a_401(gateway):
    """Each /v1 route (GET and POST) x no, malformed, unknown, expired and revoked credentials: 401, before
    any body is read or anything is published."""
    client, _, names = gateway
    credentials = {"missing": {}, "malformed": bearer("not-a-token"),
                   "unknown": bearer("gst_0123456789abcdef_" + "x" * 43), "expired": bearer(names["expired"]),
                   "revoked": bearer(names["revoked"])}
    cells = 0
    for method, path in [("GET", p) for p, _ in routes()] + [("POST", p) for p, _ in post_routes()]:
        url, _ = request_path(path, own=True)
        for reason, headers in credentials.items():
            response = await client.request(method, url, headers=headers, json={"gpus": 1, "command": ["true"]})
            assert assert_problem(response, 401)["status"] == 401, (method, path, reason)
            cells += 1
    assert cells == (len(routes()) + len(post_routes())) * len(credentials)


async def test_a_user_lists_only_its_tenant_s_jobs_and_naming_another_tenant_is_403(gateway):
    client, _, names = gateway
    body = (await client.get("/v1/jobs", headers=bearer(names["user"]), params={"limit": 500})).json()
    assert sorted(j["job_id"] for j in body["jobs"]) == JOBS["a"] and body["next"] is None
    assert {j["tenant"] for j in body["jobs"]} == {"a"}
    denied = assert_problem(await client.get("/v1/jobs", headers=bearer(names["user"]), params={"tenant": "b"}), 403)
    assert "role user" in denied["detail"]
    everyone = (await client.get("/v1/jobs", headers=bearer(names["operator"]), params={"limit": 500})).json()
    assert len(everyone["jobs"]) == 10


async def test_another_tenant_s_job_is_the_same_404_as_a_missing_one(gateway):
    client, _, names = gateway
    other = await client.get("/v1/jobs/b-00", headers=bearer(names["user"]))
    missing = await client.get("/v1/jobs/no-such-job", headers=bearer(names["user"]))
    assert assert_problem(other, 404) == assert_problem(missing, 404)
    own = (await client.get("/v1/jobs/a-00", headers=bearer(names["user"]))).json()
    assert own["tenant"] == "a" and own["state"] == "Admitted"
    assert [e["type"] for e in own["events"]][:1] == ["JobSubmitted"] and own["events"][0]["version"] == 1
    assert own["waiting"]["queue"].startswith("quota")


async def test_pagination_returns_every_job_exactly_once_newest_first(gateway):
    client, _, names = gateway
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await client.get("/v1/jobs", headers=bearer(names["operator"]), params=params)).json()
        seen += [(j["submitted_at"], j["job_id"]) for j in page["jobs"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(j for _, j in seen) == sorted(JOBS["a"] + JOBS["b"])
    assert seen == sorted(seen, reverse=True)
    assert_problem(await client.get("/v1/jobs", headers=bearer(names["operator"]), params={"cursor": "zz"}), 400)
    assert_problem(await client.get("/v1/jobs", headers=bearer(names["operator"]), params={"limit": 501}), 422)
    filtered = (await client.get("/v1/jobs", headers=bearer(names["operator"]), params={"state": "Running"})).json()
    assert filtered["jobs"] == []


def _v1() -> list:
    """Every /v1 route the app serves, whichever module declares it (no router can be left out)."""
    app = create_app(GatewaySettings(database_url="postgresql://127.0.0.1:1/none"))  # built, never started
    # each included router (FastAPI keeps it whole, as its original router) and any route of the app's own
    served = [r for item in app.routes for r in getattr(getattr(item, "original_router", None), "routes", [item])]
    return [r for r in served if getattr(r, "path", "").startswith("/v1")]


def routes() -> list[tuple[str, Action]]:
    """Every /v1 GET route with the action it names: a route without one fails here (the POST routes:
    ``post_routes``)."""
    v1 = _v1()
    assert all(ACTION_KEY in (r.openapi_extra or {}) for r in v1), [r.path for r in v1]
    assert {m for r in v1 for m in r.methods} == {"GET", "POST"}  # a new method needs its own matrix below
    return [(r.path, Action(r.openapi_extra[ACTION_KEY])) for r in v1 if "GET" in r.methods]


def post_routes() -> list[tuple[str, Action]]:
    return [(r.path, Action(r.openapi_extra[ACTION_KEY])) for r in _v1() if "POST" in r.methods]


# what an allowed request answers where the seeded data has nothing to show (the seeded jobs never ran)
ALLOWED_STATUS = {"/v1/jobs/{job_id}/logs": 404}


ROLES = {"user": Role.USER, "tenant-admin": Role.TENANT_ADMIN, "viewer": Role.VIEWER, "operator": Role.OPERATOR}


def expected(role: Role, action: Action, own: bool) -> int:
    """The status the rule table gives a request for the caller's own tenant's (or the cluster's) resource,
    or for another tenant's."""
    scope = RULES[(role, action)]
    path = next(p for p, a in routes() if a is action)
    if scope is Scope.NONE or (scope is Scope.OWN_SUBJECT and own):  # the seeded jobs were submitted by no token
        return 403
    if own or scope is Scope.ANY:
        return ALLOWED_STATUS.get(path, 200)
    return 404 if "{job_id}" in path else 403


def request_path(path: str, own: bool) -> tuple[str, dict[str, str]]:
    if "{node_id}" in path:
        return path.replace("{node_id}", "n1"), {}
    if "{job_id}" in path:
        return path.replace("{job_id}", "a-01" if own else "b-01"), {}
    bounded = {"max_s": "0"} if path == "/v1/stream" else {}  # the change feed: answered, then ended at once
    return path, ({} if own or path == "/v1/nodes" else {"tenant": "b"}) | bounded


async def test_every_route_answers_every_role_as_the_rule_table_says(gateway):
    client, _, names = gateway
    cells = 0
    for path, action in routes():
        for name, role in ROLES.items():
            for own in (True, False):
                url, params = request_path(path, own)
                response = await client.get(url, headers=bearer(names[name]), params=params)
                want = expected(role, action, own)
                assert response.status_code == want, (path, name, own, response.text)
                if want != 200:
                    detail = assert_problem(response, want)["detail"]
                    assert f"role {role}" in detail or (want == ALLOWED_STATUS.get(path) and "has not run" in detail)
                cells += 1
    assert cells == len(routes()) * len(ROLES) * 2


async def test_every_submission_route_answers_every_role_as_the_rule_table_says(gateway):
    """Authorization of the POST routes, before anything is published: this fixture's gateway has no
    producer key, so an allowed submission ends in 503 (test_gateway_submit.py submits for real)."""
    client, _, names = gateway
    cells = 0
    for path, action in post_routes():
        for name, role in ROLES.items():
            for own in (True, False):
                spec = {"tenant": "a" if own else "b", "gpus": 1, "command": ["true"]}
                body = {"jobs": [spec]} if path.endswith(":batch") else spec
                url, _ = request_path(path, own)
                response = await client.post(url, headers=bearer(names[name]), json=body)
                scope = RULES[(role, action)]
                if "{node_id}" in path:  # operators only; the seeded node n1 is not cordoned
                    want = 503 if scope is Scope.ANY else 403
                    if path.endswith("/uncordon") and scope is Scope.ANY:
                        assert response.status_code == 200 and response.json()["uncordon"] == "uncordoned already"
                    else:
                        assert assert_problem(response, want)["status"] == want, (path, name, own, response.text)
                elif "{job_id}" in path:  # control of a seeded job of tenant a (own) or b, submitted by no token
                    allowed_status = 409 if path.endswith("/release") else 503  # the seeded jobs are not held
                    want = 403 if scope in (Scope.NONE, Scope.OWN_SUBJECT) and (own or scope is Scope.NONE) else (
                        allowed_status if own or scope is Scope.ANY else 404)
                    assert assert_problem(response, want)["status"] == want, (path, name, own, response.text)
                elif scope is Scope.NONE:
                    assert f"role {role}" in assert_problem(response, 403)["detail"]
                elif path == "/v1/whatif":  # a JobSpec is no what-if request: 422 once the role may replay
                    assert response.status_code == 422 and "no what-if request" in response.json()["detail"], (
                        path, name, response.text)  # a problem with every reason (test_gateway_whatif.py)
                elif path.endswith(":check") and (own or scope is Scope.ANY):  # a check publishes nothing: 200
                    assert response.status_code == 200 and response.json()["verdict"] == "wait", response.text
                elif own or scope is Scope.ANY:
                    assert "no producer credential" in assert_problem(response, 503)["detail"], (path, name)
                elif path.endswith(":batch"):  # judged job by job: this one refused, with why
                    assert response.status_code == 200, response.text
                    [result] = response.json()["results"]
                    assert result["status"] == 403 and f"role {role}" in result["reasons"][0]
                else:
                    assert f"role {role}" in assert_problem(response, 403)["detail"]
                cells += 1
    assert cells == len(post_routes()) * len(ROLES) * 2


async def test_a_viewer_sees_the_queue_as_ids_and_positions_only(gateway):
    client, _, names = gateway
    viewer = (await client.get("/v1/queue", headers=bearer(names["viewer"]))).json()["jobs"]
    assert sorted(j["job_id"] for j in viewer) == sorted(JOBS["a"] + JOBS["b"])
    assert all(set(j) == {"job_id", "queue", "position"} for j in viewer)
    user = (await client.get("/v1/queue", headers=bearer(names["user"]))).json()["jobs"]
    assert sorted(j["job_id"] for j in user) == JOBS["a"] and all(j["tenant"] == "a" for j in user)


async def test_nodes_and_tenants_views(gateway):
    client, _, names = gateway
    [node] = (await client.get("/v1/nodes", headers=bearer(names["viewer"]))).json()["nodes"]
    assert (node["node_id"], node["status"], node["gpus"], node["healthy_gpus"], node["allocations"]) == (
        "n1", "Ready", 2, 2, 0)
    assert node["lease_epoch"] == 1 and node["gpu_models"] == ["H100-80GB"]
    tenants = (await client.get("/v1/tenants", headers=bearer(names["user"]))).json()
    assert tenants["tenant"] == "a" and all(u["tenant"] == "a" for u in tenants["usage"])


async def test_unknown_routes_and_oversized_bodies_are_problems(gateway):
    client, _, names = gateway
    assert_problem(await client.get("/v1/nothing", headers=bearer(names["operator"])), 404)
    big = await client.request("GET", "/v1/jobs", headers=bearer(names["operator"]), content=b"x" * (1024 * 1024 + 1))
    assert_problem(big, 413)


async def test_the_real_process_serves_health_and_an_authorized_job_list(database_url: str, tmp_path: Path):
    conn = await connect(database_url)
    try:
        await seed(conn)
        token = await issue(conn, "tenant-admin", "b")
    finally:
        await conn.close()
    port = free_port()
    env = {**os.environ, "GPUSCHED_DATABASE_URL": database_url, "GPUSCHED_GATEWAY_PORT": str(port)}
    pid = spawn("gateway", [sys.executable, "-m", "services.gateway"], tmp_path, env, cwd=ROOT)
    try:
        wait_for_port(port, pid=pid, log=tmp_path / "gateway.log")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).status_code == 200
            body = (await client.get("/v1/jobs", headers=bearer(token))).json()
            assert sorted(j["job_id"] for j in body["jobs"]) == JOBS["b"]
    finally:
        stop_pid(pid)
    assert token not in (tmp_path / "gateway.log").read_text()
