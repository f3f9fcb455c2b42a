"""The dashboard's sign-in and session on the real gateway app and PostgreSQL: a token typed into the page
becomes an HttpOnly, SameSite=Strict cookie that authenticates /v1 reads; every unsafe request made with
the cookie needs the session's CSRF token and a same-origin page; a bad or revoked token signs nobody in;
sign-out clears the cookie; the pages and files carry a strict Content-Security-Policy; and the change
feed streams a job's events to the tenant's user, not to another tenant's."""

from __future__ import annotations

import asyncio
import json

import httpx

from gpusched_common.db import connect
from gpusched_common.infra.processes import free_port
from services.gateway.app import create_app
from services.gateway.dashboard import session
from services.gateway.settings import GatewaySettings
from tests.builders import T0
from tests.integration import test_gateway_api as api

ORIGIN = {"Origin": "http://gw"}
gateway = api.gateway  # the fixture: the real app and its lifespan over a seeded database
issue, seed = api.issue, api.seed


async def signed_in(client: httpx.AsyncClient, token: str) -> dict:
    response = await client.post("/ui/session", json={"token": token}, headers=ORIGIN)
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_typed_token_becomes_a_strict_httponly_cookie_that_reads_the_api(gateway):
    client, _, names = gateway
    who = await signed_in(client, names["user"])
    assert (who["role"], who["tenant"]) == ("user", "a") and who["csrf"] == session.csrf_token(names["user"])
    assert who["may"] == {"nodes": False, "jobs": True, "history": True, "act": True, "whatif": False}
    raw = (await client.post("/ui/session", json={"token": names["user"]}, headers=ORIGIN)).headers["set-cookie"]
    assert raw.startswith(f"{session.COOKIE}=") and "HttpOnly" in raw and "SameSite=Strict" in raw, raw
    assert "Secure" not in raw  # plain HTTP here; over TLS (or gateway_cookie_secure) it is Secure
    jobs = (await client.get("/v1/jobs")).json()["jobs"]  # no Authorization header: the cookie
    assert jobs and {j["tenant"] for j in jobs} == {"a"}
    assert (await client.get("/v1/nodes")).status_code == 403  # the same table as a bearer token
    assert (await client.get("/ui/session")).json()["subject"] == who["subject"]


async def test_an_action_with_the_cookie_needs_the_csrf_token_and_a_same_origin_page(gateway):
    client, _, names = gateway
    who = await signed_in(client, names["tenant-admin"])
    url = "/v1/jobs/a-01/hold"
    assert (await client.post(url, json={}, headers=ORIGIN)).status_code == 403  # no token
    wrong = await client.post(url, json={}, headers={**ORIGIN, "X-CSRF-Token": session.csrf_token("other")})
    assert wrong.status_code == 403 and "X-CSRF-Token" in wrong.json()["detail"]
    evil = await client.post(url, json={}, headers={"Origin": "http://evil.example", "X-CSRF-Token": who["csrf"]})
    assert evil.status_code == 403 and "cross-origin" in evil.json()["detail"]
    ok = await client.post(url, json={}, headers={**ORIGIN, "X-CSRF-Token": who["csrf"]})
    assert ok.status_code != 403, ok.text  # judged as the job's action now (no broker here: 503 at most)
    # a bearer header needs no CSRF token: no browser adds one by itself
    bare = httpx.AsyncClient(transport=client._transport, base_url="http://gw")
    async with bare:
        held = await bare.post(url, json={}, headers={"Authorization": f"Bearer {names['tenant-admin']}"})
    assert held.status_code == ok.status_code


async def test_bad_tokens_sign_nobody_in_and_sign_out_clears_the_cookie(gateway):
    client, _, names = gateway
    for body, status in (({"token": names["revoked"]}, 401), ({"token": names["expired"]}, 401),
                         ({"token": "gst_0123456789abcdef_" + "x" * 43}, 401), ({"token": "two words"}, 400),
                         ({"nothing": 1}, 400), ([1, 2], 400)):
        response = await client.post("/ui/session", json=body, headers=ORIGIN)
        assert response.status_code == status and "set-cookie" not in response.headers, (body, response.text)
    assert (await client.post("/ui/session", content=b"token=x", headers={**ORIGIN, "Content-Type": "text/plain"})
            ).status_code == 415
    assert (await client.post("/ui/session", json={"token": names["user"]},
                              headers={"Origin": "http://evil.example"})).status_code == 403
    assert (await client.get("/ui/session")).status_code == 401
    who = await signed_in(client, names["user"])
    assert (await client.post("/ui/session/signout", headers=ORIGIN)).status_code == 403  # CSRF-checked too
    out = await client.post("/ui/session/signout", headers={**ORIGIN, "X-CSRF-Token": who["csrf"]})
    assert out.status_code == 204 and "Max-Age=0" in out.headers["set-cookie"]
    assert (await client.get("/ui/session")).status_code == 401


async def test_sign_in_attempts_are_limited_per_address(database_url):
    app = create_app(GatewaySettings(database_url=database_url, gateway_signin_burst=3, gateway_signin_rate_per_s=0.01))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            statuses = [(await client.post("/ui/session", json={"token": "gst_guess"}, headers=ORIGIN)).status_code
                        for _ in range(5)]
    assert statuses == [401, 401, 401, 429, 429]


async def test_pages_and_files_carry_a_strict_policy_and_only_known_files_are_served(gateway):
    client, _, _ = gateway
    for path in ("/ui/", "/ui/jobs/a-01", "/ui/signin", "/ui/static/app.js", "/ui/static/style.css"):
        response = await client.get(path)
        assert response.status_code == 200, path
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe" not in policy
        assert response.headers["x-content-type-options"] == "nosniff"
    page = (await client.get("/ui/")).text
    assert "<script" in page and "<script>" not in page  # scripts by src only: the policy allows no inline one
    etag = (await client.get("/ui/static/app.js")).headers["etag"]
    assert (await client.get("/ui/static/app.js", headers={"If-None-Match": etag})).status_code == 304
    for bad in ("/ui/static/nope.js", "/ui/static/..%2f..%2fauth.py", "/ui/static/%2e%2e/routes.py",
                "/ui/static/session.py"):
        assert (await client.get(bad)).status_code == 404, bad
    assert (await client.get("/ui", follow_redirects=False)).headers["location"] == "/ui/"


async def test_the_change_feed_streams_a_tenant_s_job_events_to_its_user_only(database_url):
    """A real server (the feed streams; the in-process transport would wait for the end): a user of
    tenant a sees a's job being submitted, a user of b sees nothing of it but what comes after."""
    from gpusched_common.jobs import append_job_events, load_job  # noqa: PLC0415
    from gpusched_core import lifecycle  # noqa: PLC0415
    from tests.builders import a_job  # noqa: PLC0415
    import uvicorn  # noqa: PLC0415

    conn = await connect(database_url)
    try:
        await seed(conn)
        user_a, user_b = await issue(conn, "user", "a"), await issue(conn, "user", "b")
    finally:
        await conn.close()
    port = free_port()
    app = create_app(GatewaySettings(database_url=database_url, gateway_stream_poll_s=0.05))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        seen: dict[str, list[dict]] = {"a": [], "b": []}

        async def listen(name: str, token: str, ready: asyncio.Event) -> None:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                async with client.stream("GET", "/v1/stream", params={"max_s": 20},
                                         headers={"Authorization": f"Bearer {token}"}) as response:
                    assert response.status_code == 200
                    kind = None
                    async for line in response.aiter_lines():
                        if line.startswith("retry:"):
                            ready.set()
                        elif line.startswith("event: "):
                            kind = line[7:]
                        elif line.startswith("data: ") and kind == "job":
                            seen[name].append(json.loads(line[6:]))
                            if seen[name][-1]["job_id"] == "marker":
                                return

        ready_a, ready_b = asyncio.Event(), asyncio.Event()
        listeners = [asyncio.create_task(listen("a", user_a, ready_a)), asyncio.create_task(listen("b", user_b, ready_b))]
        await asyncio.wait_for(asyncio.gather(ready_a.wait(), ready_b.wait()), 10)
        await asyncio.sleep(0.3)  # the feed has read its starting position
        conn = await connect(database_url)
        try:
            for job_id, tenant in (("fresh-a", "a"), ("fresh-b", "b"), ("marker", "a")):
                state = await load_job(conn, job_id)
                decided = lifecycle.decide(state, lifecycle.RegisterSubmission(a_job(job_id).tenant(tenant).spec(), T0), T0)
                await append_job_events(conn, state, decided, producer="test", now=T0)
            state = await load_job(conn, "marker-b")
            await append_job_events(conn, state, lifecycle.decide(
                state, lifecycle.RegisterSubmission(a_job("marker-b").tenant("b").spec(), T0), T0), producer="test", now=T0)
        finally:
            await conn.close()
        await asyncio.wait_for(listeners[0], 15)
        assert [e["job_id"] for e in seen["a"]][:1] == ["fresh-a"] and {e["tenant"] for e in seen["a"]} == {"a"}
        assert "marker" in [e["job_id"] for e in seen["a"]]
        assert seen["a"][0]["type"] == "JobSubmitted"
        deadline = asyncio.get_running_loop().time() + 10
        while not any(e["job_id"] == "marker-b" for e in seen["b"]) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert [e["job_id"] for e in seen["b"]] and {e["tenant"] for e in seen["b"]} == {"b"}, seen["b"]
        assert "fresh-a" not in [e["job_id"] for e in seen["b"]]
        listeners[1].cancel()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 15)
