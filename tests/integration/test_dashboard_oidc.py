"""The dashboard's OIDC sign-in (authorization code + PKCE) against a real identity provider on loopback
and the real gateway app on PostgreSQL: the browser is sent to the issuer, comes back with a code, and
leaves with a session cookie holding the verified ID token, which then reads the API with the role and
tenant of its claims; a callback that was not started here, an ID token without the sign-in's nonce and a
code redeemed without its PKCE verifier sign nobody in; without a client id the routes do not exist."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from services.gateway.app import create_app
from services.gateway.dashboard import session
from services.gateway.settings import GatewaySettings
from tests.integration.test_gateway_oidc import CLAIMS, seeded
from tests.integration.test_oidc import IdentityProvider

CLIENT = "gpusched-dashboard"


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    provider = IdentityProvider()
    provider.login_claims = {"sub": "u-7", "email": "bo@example.com", "groups": ["user"], "tenants": ["a"]}
    provider.start()
    yield provider
    provider.stop()


@pytest.fixture
async def dashboard(database_url: str, idp: IdentityProvider):
    await seeded(database_url)
    app = create_app(GatewaySettings(database_url=database_url, oidc_issuer=idp.issuer, oidc_audience=CLIENT,
                                     oidc_client_id=CLIENT, **CLAIMS))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client


async def through_the_issuer(client: httpx.AsyncClient, next_path: str = "/ui/jobs") -> httpx.Response:
    """The browser's round trip: the gateway's redirect to the issuer, the issuer's back; the callback's
    answer."""
    start = await client.get("/ui/oidc/login", params={"next": next_path})
    assert start.status_code == 302, start.text
    asked = {k: v[0] for k, v in parse_qs(urlsplit(start.headers["location"]).query).items()}
    assert asked["code_challenge_method"] == "S256" and asked["client_id"] == CLIENT and "openid" in asked["scope"]
    assert "SameSite=Lax" in start.headers["set-cookie"] and "HttpOnly" in start.headers["set-cookie"]
    async with httpx.AsyncClient() as browser:
        back = await browser.get(start.headers["location"])
    assert back.status_code == 302
    callback = urlsplit(back.headers["location"])
    assert callback.path == "/ui/oidc/callback"
    return await client.get(f"{callback.path}?{callback.query}")


async def test_signing_in_through_the_issuer_gives_a_session_with_the_claims_role_and_tenant(dashboard, idp):
    options = (await dashboard.get("/ui/signin/options")).json()
    assert options == {"oidc": True}
    done = await through_the_issuer(dashboard)
    assert done.status_code == 302 and done.headers["location"] == "/ui/jobs", done.text
    cookies = done.headers.get_list("set-cookie")
    assert any(c.startswith(f"{session.COOKIE}=") and "SameSite=Strict" in c and "HttpOnly" in c for c in cookies)
    who = (await dashboard.get("/ui/session")).json()
    assert (who["role"], who["tenant"]) == ("user", "a") and "bo@example.com" in who["subject"]
    jobs = (await dashboard.get("/v1/jobs")).json()["jobs"]
    assert jobs and {j["tenant"] for j in jobs} == {"a"}


async def test_a_callback_not_started_here_a_wrong_nonce_and_a_lost_verifier_sign_nobody_in(dashboard, idp):
    foreign = await dashboard.get("/ui/oidc/callback", params={"code": "c", "state": "s"})
    assert foreign.status_code == 400 and "not started here" in foreign.json()["detail"]
    idp.tamper_nonce = True
    wrong = await through_the_issuer(dashboard)
    assert wrong.status_code == 401 and "nonce" in wrong.json()["detail"]
    idp.tamper_nonce = False
    start = await dashboard.get("/ui/oidc/login")
    flow = dashboard.cookies.get("gpusched_oidc_flow")
    state, nonce, _, rest = flow.split(".")
    dashboard.cookies.set("gpusched_oidc_flow", ".".join((state, nonce, "not-the-verifier", rest)), path="/ui/oidc")
    async with httpx.AsyncClient() as browser:
        back = urlsplit((await browser.get(start.headers["location"])).headers["location"])
    lost = await dashboard.get(f"{back.path}?{back.query}")
    assert lost.status_code == 401 and "would not redeem" in lost.json()["detail"]
    assert (await dashboard.get("/ui/session")).status_code == 401


async def test_without_a_client_id_there_is_no_oidc_sign_in(database_url, idp):
    app = create_app(GatewaySettings(database_url=database_url, oidc_issuer=idp.issuer, oidc_audience=CLIENT))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            assert (await client.get("/ui/signin/options")).json() == {"oidc": False}
            assert (await client.get("/ui/oidc/login")).status_code == 404
