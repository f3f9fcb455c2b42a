"""Dashboard sign-in with the configured OIDC issuer (the authorization-code flow with PKCE, RFC 7636):

1. ``GET /ui/oidc/login?next=/ui/...`` sends the browser to the issuer's ``authorization_endpoint`` (from
   its discovery document) with a fresh ``state``, ``nonce`` and PKCE challenge; the three secrets and
   ``next`` wait in a short-lived HttpOnly cookie (SameSite=Lax: the issuer's redirect back is a top-level
   navigation from another site, which a Strict cookie would not follow).
2. ``GET /ui/oidc/callback?code=...&state=...``: the state must match the cookie's; the code is redeemed at
   the ``token_endpoint`` with the PKCE verifier (and the client secret, for a confidential client); the ID
   token is verified as every bearer JWT is (issuer, audience, expiry, the issuer's keys: one
   ``OidcVerifier``) and must carry the nonce; it then becomes the session cookie, exactly as a typed token
   would (``session``), and the browser goes on to ``next``.

Configured by ``GPUSCHED_OIDC_ISSUER`` and ``GPUSCHED_OIDC_AUDIENCE`` (the ID token's audience: the client
id, unless the issuer adds the API's audience) with ``GPUSCHED_OIDC_CLIENT_ID`` and, optionally,
``GPUSCHED_OIDC_CLIENT_SECRET_FILE``; ``GPUSCHED_OIDC_REDIRECT_URL`` where the gateway sits behind a proxy
(else ``<this gateway>/ui/oidc/callback``). Without a client id the routes answer 404."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import jwt
from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from gpusched_core.access import Principal

from services.gateway.auth import Problem
from services.gateway.dashboard import session
from services.gateway.dashboard.routes import HEADERS, _secure

router = APIRouter(include_in_schema=False)
FLOW_COOKIE = "gpusched_oidc_flow"
FLOW_MAX_AGE_S = 600
_TIMEOUT_S = 10.0


def pkce_challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def _configured(request: Request) -> Any:
    settings = request.app.state.settings
    if request.app.state.oidc is None or not settings.oidc_client_id:
        raise Problem(404, "this gateway has no OIDC sign-in (GPUSCHED_OIDC_ISSUER, _AUDIENCE and _CLIENT_ID)")
    return settings


def _redirect_url(request: Request) -> str:
    return request.app.state.settings.oidc_redirect_url or str(request.url_for("oidc_callback"))


async def _endpoints(request: Request) -> tuple[str, str]:
    """The issuer's authorization and token endpoints (its discovery document, checked to be its own),
    fetched once per process: a sign-in needs them twice (login, callback)."""
    known = getattr(request.app.state, "oidc_endpoints", None)
    if known is None:
        config = request.app.state.oidc.config
        known = request.app.state.oidc_endpoints = await _discover(config.issuer, config.discovery_url)
    return known


async def _discover(issuer: str, discovery_url: str) -> tuple[str, str]:
    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT_S, follow_redirects=False) as http:
            response = await http.get(discovery_url)
            response.raise_for_status()
            doc = response.json()
    except (httpx.HTTPError, ValueError):
        raise Problem(503, "the OIDC issuer's discovery document is unreachable or not JSON") from None
    if not isinstance(doc, dict):
        raise Problem(503, "the OIDC issuer's discovery document is not a JSON object")
    endpoints = doc.get("authorization_endpoint"), doc.get("token_endpoint")
    if doc.get("issuer") != issuer or not all(
            isinstance(e, str) and urlsplit(e).scheme in ("https", "http") for e in endpoints):
        raise Problem(503, "the OIDC issuer's discovery document names another issuer or no usable endpoints")
    return endpoints[0], endpoints[1]


@router.get("/ui/oidc/login")
async def oidc_login(request: Request, next: str | None = None) -> Response:  # noqa: A002 - the query's name
    settings = _configured(request)
    authorize_at, _ = await _endpoints(request)
    state, nonce, verifier = (secrets.token_urlsafe(24) for _ in range(3))
    query = urlencode({"response_type": "code", "client_id": settings.oidc_client_id, "scope": settings.oidc_scopes,
                       "redirect_uri": _redirect_url(request), "state": state, "nonce": nonce,
                       "code_challenge": pkce_challenge(verifier), "code_challenge_method": "S256"})
    response = RedirectResponse(f"{authorize_at}?{query}", status_code=302, headers=HEADERS)
    flow = ".".join((state, nonce, verifier, base64.urlsafe_b64encode(session.safe_next(next).encode()).decode()))
    response.headers["Set-Cookie"] = (f"{FLOW_COOKIE}={flow}; Max-Age={FLOW_MAX_AGE_S}; Path=/ui/oidc; HttpOnly;"
                                      f" SameSite=Lax" + ("; Secure" if _secure(request) else ""))
    return response


@router.get("/ui/oidc/callback", name="oidc_callback")
async def oidc_callback(request: Request, code: str | None = None, state: str | None = None,
                        error: str | None = None) -> Response:
    settings = _configured(request)
    if error:
        raise Problem(401, f"the OIDC issuer refused the sign-in: {error[:100]}")
    flow = (request.cookies.get(FLOW_COOKIE) or "").split(".")
    if len(flow) != 4 or not state or not hmac.compare_digest(flow[0], state):
        raise Problem(400, "this sign-in was not started here or took too long: start again from the sign-in page")
    if not code or len(code) > 4096:
        raise Problem(400, "the issuer's answer carries no usable code")
    _, nonce, verifier, encoded_next = flow
    id_token = await _redeem(request, settings, code, verifier)
    verified = await request.app.state.oidc.verify(id_token)
    if not isinstance(verified, Principal):
        raise Problem(401, f"OIDC token refused: {verified.detail}")
    claims = jwt.decode(id_token, options={"verify_signature": False})  # verified just above
    if not hmac.compare_digest(str(claims.get("nonce", "")), nonce):
        raise Problem(401, "the ID token does not carry this sign-in's nonce")
    try:
        target = session.safe_next(base64.urlsafe_b64decode(encoded_next.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        target = "/ui/"
    response = RedirectResponse(target, status_code=302, headers=HEADERS)
    max_age = max(60, min(settings.gateway_session_max_age_s, int(claims["exp"]) - int(claims.get("iat", 0))))
    response.headers.append("Set-Cookie", session.cookie_header(id_token, secure=_secure(request), max_age_s=max_age))
    response.headers.append("Set-Cookie", f"{FLOW_COOKIE}=; Max-Age=0; Path=/ui/oidc; HttpOnly; SameSite=Lax")
    return response


async def _redeem(request: Request, settings: Any, code: str, verifier: str) -> str:
    _, token_at = await _endpoints(request)
    form = {"grant_type": "authorization_code", "code": code, "redirect_uri": _redirect_url(request),
            "client_id": settings.oidc_client_id, "code_verifier": verifier}
    secret_file = settings.oidc_client_secret_file
    if secret_file is not None:
        form["client_secret"] = secret_file.read_text().strip()
    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT_S, follow_redirects=False) as http:
            response = await http.post(token_at, data=form, headers={"Accept": "application/json"})
        doc = response.json()
    except (httpx.HTTPError, ValueError):
        raise Problem(503, "the OIDC issuer's token endpoint is unreachable or did not answer JSON") from None
    if response.status_code != 200 or not isinstance(doc, dict):
        detail = doc.get("error", "") if isinstance(doc, dict) else ""
        raise Problem(401, f"the OIDC issuer would not redeem the code ({response.status_code} {str(detail)[:100]})")
    id_token = doc.get("id_token")
    if not isinstance(id_token, str) or session.token_shape_problem(id_token) is not None:
        raise Problem(401, "the OIDC issuer's answer holds no usable ID token")
    return id_token

