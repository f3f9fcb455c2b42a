"""The gateway's OIDC sign-in on real PostgreSQL and a real identity provider on loopback (discovery
document and JWKS over HTTP, from test_oidc.py), driving the real app with its lifespan: a JWT's role and
tenant (from the configured claim names) scope what it reads like an API token's would; every refused JWT
is a 401 problem counted by its ``oidc-...`` reason and never echoed; API tokens keep working beside it;
and a gateway without OIDC settings takes a JWT for a malformed API token."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest

from gpusched_common.db import connect
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.integration.test_gateway_api import JOBS, assert_problem, bearer, issue, seed
from tests.integration.test_oidc import KEYS, IdentityProvider

AUDIENCE = "gpusched"
# claim names other than the defaults, so the test shows the gateway passes its settings through
CLAIMS = {"oidc_subject_claim": "email", "oidc_role_claim": "groups", "oidc_tenant_claim": "tenants"}


def a_jwt(idp: IdentityProvider, key: str = "main", kid: str = "k1", **overrides: Any) -> str:
    """A user of tenant a, valid for five minutes, signed RS256; an override of None drops that claim."""
    now = int(time.time())
    claims = {"iss": idp.issuer, "aud": AUDIENCE, "sub": "u-1", "email": "alice@example.com", "iat": now,
              "exp": now + 300, "groups": ["staff", "user"], "tenants": ["a"], **overrides}
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, KEYS[key], algorithm="RS256",
                      headers={"kid": kid})


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    provider = IdentityProvider()
    provider.start()
    yield provider
    provider.stop()


async def seeded(database_url: str) -> str:
    """Seeds tenants a and b; an API token of a user of tenant a."""
    conn = await connect(database_url)
    try:
        await seed(conn)
        return await issue(conn, "user", "a")
    finally:
        await conn.close()


@pytest.fixture
async def oidc_gateway(database_url: str, idp: IdentityProvider):
    """(client, idp, an API token of a user of tenant a) over the real app, OIDC configured."""
    api_token = await seeded(database_url)
    app = create_app(GatewaySettings(database_url=database_url, oidc_issuer=idp.issuer, oidc_audience=AUDIENCE,
                                     **CLAIMS))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            yield client, idp, api_token


def listed(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return sorted(j["job_id"] for j in response.json()["jobs"])


async def test_a_user_jwt_lists_only_its_tenant_s_jobs_and_another_tenant_s_job_is_404(oidc_gateway):
    client, idp, _ = oidc_gateway
    token = a_jwt(idp)
    assert listed(await client.get("/v1/jobs", headers=bearer(token), params={"limit": 500})) == JOBS["a"]
    own = await client.get("/v1/jobs/a-01", headers=bearer(token))
    assert own.status_code == 200 and own.json()["tenant"] == "a"
    other = await client.get("/v1/jobs/b-01", headers=bearer(token))
    missing = await client.get("/v1/jobs/no-such-job", headers=bearer(token))
    assert assert_problem(other, 404) == assert_problem(missing, 404)
    assert_problem(await client.get("/v1/jobs", headers=bearer(token), params={"tenant": "b"}), 403)


async def test_an_operator_jwt_sees_every_tenant_s_jobs(oidc_gateway):
    client, idp, _ = oidc_gateway
    token = a_jwt(idp, groups=["operator"], tenants=None)
    assert listed(await client.get("/v1/jobs", headers=bearer(token), params={"limit": 500})) == sorted(
        JOBS["a"] + JOBS["b"])
    assert (await client.get("/v1/jobs/b-01", headers=bearer(token))).status_code == 200


async def test_each_refused_jwt_is_a_401_problem_counted_by_its_oidc_reason_and_never_echoed(oidc_gateway):
    client, idp, _ = oidc_gateway
    now = int(time.time())
    cases = [("oidc-wrong-audience", a_jwt(idp, aud="another-service")),
             ("oidc-expired", a_jwt(idp, iat=now - 900, exp=now - 120)),  # beyond the 30 s leeway
             ("oidc-bad-signature", a_jwt(idp, key="other")),  # another key under the issuer's kid
             ("oidc-unknown-key", a_jwt(idp, key="other", kid="k9")),
             ("oidc-claims", a_jwt(idp, tenants=None))]  # signed and current, but a user of no tenant
    for reason, token in cases:
        response = await client.get("/v1/jobs", headers=bearer(token))
        assert "OIDC token refused" in assert_problem(response, 401)["detail"], reason
        assert response.headers["www-authenticate"].startswith("Bearer"), reason
        _, payload, signature = token.split(".")
        assert all(part not in response.text for part in (token, payload, signature)), reason
    metrics = (await client.get("/metrics")).text
    for reason, _ in cases:
        assert f'gpusched_gateway_auth_failures_total{{reason="{reason}"}} 1.0' in metrics, (reason, metrics)
    assert 'reason="malformed"' not in metrics  # a JWT is judged as a JWT, never as an API token


async def test_api_tokens_still_work_beside_oidc(oidc_gateway):
    client, idp, api_token = oidc_gateway
    assert listed(await client.get("/v1/jobs", headers=bearer(api_token), params={"limit": 500})) == JOBS["a"]
    assert_problem(await client.get("/v1/jobs/b-01", headers=bearer(api_token)), 404)
    assert_problem(await client.get("/v1/jobs", headers=bearer("gst_0123456789abcdef_" + "x" * 43)), 401)
    assert 'reason="unknown"' in (await client.get("/metrics")).text
    assert idp.jwks_requests == 0  # an API token never sends the gateway to the issuer


async def test_without_oidc_settings_a_jwt_is_refused_as_a_malformed_api_token(database_url, idp):
    await seeded(database_url)
    app = create_app(GatewaySettings(database_url=database_url))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            token = a_jwt(idp)
            response = await client.get("/v1/jobs", headers=bearer(token))
            assert "malformed" in assert_problem(response, 401)["detail"]
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert token not in response.text
            metrics = (await client.get("/metrics")).text
    assert 'gpusched_gateway_auth_failures_total{reason="malformed"} 1.0' in metrics
    assert "oidc-" not in metrics and idp.jwks_requests == 0
