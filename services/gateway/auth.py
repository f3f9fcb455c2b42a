"""Who is asking and may they: the gateway's authentication (a bearer API token, or an OIDC JWT where an
issuer is configured -> ``Principal``; 401 counted by reason), its authorization (one
``gpusched_core.access`` decision), per-principal rate limits (429), and problem-detail answers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, generate_latest

from gpusched_common import tokens
from gpusched_common.oidc import OidcRefusal, looks_like_jwt
from gpusched_core.access import Action, Principal, Resource, authorize

from services.gateway import core
from services.gateway.dashboard import session

ACTION_KEY = "x-gpusched-action"


class Problem(Exception):
    """An answer that is a problem detail (``app`` renders it)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None, **extensions: Any) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers, self.extensions = status, detail, headers or {}, extensions


class AuthFailures:
    """Refused credentials by reason, for ``/metrics`` (a registry of this app's own: one count per process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counter = Counter("gpusched_gateway_auth_failures", "Requests refused for their credentials.",
                               ["reason"], registry=self.registry)

    def count(self, reason: str) -> None:
        self.counter.labels(reason=reason).inc()

    def prometheus(self) -> bytes:
        return generate_latest(self.registry)


def acts(action: Action) -> dict[str, Any]:
    return {ACTION_KEY: action.value}


def _refuse(request: Request, reason: str, detail: str) -> Problem:
    request.app.state.auth_failures.count(reason)
    return Problem(401, detail, {"WWW-Authenticate": 'Bearer realm="gpusched"'})


async def authenticate(request: Request) -> Principal:
    """The principal of the request's bearer token (an API token, or a JWT of the configured OIDC issuer),
    sent in the Authorization header or, from a signed-in dashboard, in the session cookie (then an unsafe
    request must be same-origin and carry the session's CSRF token: ``dashboard.session``); 401 (counted
    by reason) otherwise. The token is never logged nor echoed."""
    header = request.headers.get("authorization")
    if not header:
        cookie = request.cookies.get(session.COOKIE)
        if cookie:
            return await _from_cookie(request, cookie)
        raise _refuse(request, "missing", "no credentials: send Authorization: Bearer <token>")
    scheme, _, text = header.partition(" ")
    text = text.strip()
    if scheme.lower() != "bearer" or not text:
        raise _refuse(request, "malformed", "the Authorization header is not of the form Bearer <token>")
    return await principal_of(request, text)


async def _from_cookie(request: Request, token: str) -> Principal:
    if request.method not in session.SAFE_METHODS:
        if not session.same_origin(request.headers.get("origin"), request.headers.get("referer"),
                                   request.url.scheme, request.headers.get("host")):
            raise Problem(403, "cross-origin request refused: the dashboard's actions come from its own pages")
        if not session.csrf_matches(token, request.headers.get(session.CSRF_HEADER)):
            raise Problem(403, "missing or wrong X-CSRF-Token: reload the page (GET /ui/session gives the token)")
    return await principal_of(request, token)


async def principal_of(request: Request, text: str) -> Principal:
    """Verify one bearer token's text: 401 (counted by reason) when it is not a live token."""
    oidc = request.app.state.oidc
    if oidc is not None and looks_like_jwt(text):
        verified: Principal | OidcRefusal | tokens.TokenRefusal = await oidc.verify(text)
        if isinstance(verified, OidcRefusal):
            raise _refuse(request, f"oidc-{verified.reason.value}", f"OIDC token refused: {verified.detail}")
        return verified
    async with request.app.state.pool.acquire() as conn:
        verified = await tokens.verify(conn, text, datetime.now(UTC))
    if isinstance(verified, tokens.TokenRefusal):
        raise _refuse(request, verified.reason.value, str(verified))
    return verified


def within_rate(request: Request, principal: Principal, kind: str, cost: float = 1.0) -> None:
    """429 when the principal spent its ``kind`` (``submit``/``read``) budget: one principal's flood is
    answered cheaply and leaves every other principal's budget whole."""
    wait_s = request.app.state.limiter.take(kind, principal.subject, cost, datetime.now(UTC))
    if wait_s is not None:
        raise Problem(429, f"{principal.subject} exceeded its {kind} rate; retry in {wait_s:.1f}s",
                      {"Retry-After": str(max(1, round(wait_s)))})


Caller = Annotated[Principal, Depends(authenticate)]


def allowed(principal: Principal, action: Action, resource: Resource) -> str | None:
    """The tenant the request is allowed for (None: cluster-wide); the Decision's status and reason else."""
    decision = authorize(principal, action, resource)
    if not decision.allowed:
        raise Problem(decision.status, decision.reason)
    return decision.tenant


def problem_response(status: int, detail: str, headers: dict[str, str] | None = None,
                     **extensions: Any) -> JSONResponse:
    return JSONResponse(core.problem(status, detail, **extensions), status_code=status, headers=headers,
                        media_type=core.PROBLEM_TYPE)
