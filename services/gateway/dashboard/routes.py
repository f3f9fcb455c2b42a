"""``/ui``: the dashboard's pages, its static files and its session.

- ``GET /ui/...``: the page shell (``static/index.html``; the sign-in page at ``/ui/signin``). A shell holds
  no data: its script reads ``GET /ui/session`` and then the ``/v1`` routes, each judged by the gateway's
  authorization table, so a page shows a principal exactly what the API would.
- ``GET /ui/static/<file>``: one of the files in ``static/`` (listed once at start; any other name is 404),
  with an ETag.
- ``POST /ui/session`` ``{"token": ...}``: sign in: the token is verified as a bearer token is, then kept in
  an HttpOnly, SameSite=Strict cookie (Secure over TLS); answers who signed in and the CSRF token.
  Attempts are rate-limited per client address. ``GET /ui/session``: the same answer for a signed-in
  browser (401 else). ``POST /ui/session/signout``: clears the cookie (CSRF-checked like every action).
- Every ``/ui`` answer carries a strict Content-Security-Policy (scripts and styles of this origin only, no
  inline script, no framing), ``nosniff`` and ``Referrer-Policy: same-origin``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from gpusched_core.access import Action, Principal, Resource, authorize
from gpusched_core.access.authorize import never

from services.gateway.auth import Caller, Problem, principal_of
from services.gateway.dashboard import session

router = APIRouter(include_in_schema=False)
STATIC_DIR = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
                               " connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
}


class StaticFiles:
    """The dashboard's files, read once: name -> (bytes, media type, ETag)."""

    def __init__(self, directory: Path = STATIC_DIR) -> None:
        self.files: dict[str, tuple[bytes, str, str]] = {}
        for path in sorted(directory.glob("*")) if directory.is_dir() else []:
            if path.is_file() and path.suffix in _TYPES:
                body = path.read_bytes()
                self.files[path.name] = (body, _TYPES[path.suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"')

    def answer(self, request: Request, name: str) -> Response:
        found = self.files.get(name)
        if found is None:
            raise Problem(404, f"no dashboard file {name!r}")
        body, media_type, etag = found
        headers = {**HEADERS, "ETag": etag, "Cache-Control": "no-cache"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=media_type, headers=headers)


def _files(request: Request) -> StaticFiles:
    files = getattr(request.app.state, "dashboard_files", None)
    if files is None:
        files = request.app.state.dashboard_files = StaticFiles()
    return files


def may(principal: Principal) -> dict[str, bool]:
    """What the pages offer this principal (each still judged by its route): the cluster view, job lists,
    usage history, job actions and the history page's what-if replay."""
    own = Resource.in_tenant(None)
    return {"nodes": authorize(principal, Action.NODES_READ, Resource.cluster()).allowed,
            "jobs": authorize(principal, Action.JOB_LIST, own).allowed,
            "history": authorize(principal, Action.HISTORY_READ, own).allowed,
            "act": never(principal, Action.JOB_CANCEL) is None,
            "whatif": authorize(principal, Action.WHATIF_RUN, own).allowed}


def _who(principal: Principal, token: str | None) -> dict[str, Any]:
    return {"subject": principal.subject, "role": principal.role.value, "tenant": principal.tenant,
            "csrf": session.csrf_token(token) if token else None, "may": may(principal)}


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.app.state.settings.gateway_cookie_secure


@router.get("/ui")
async def ui_root() -> Response:
    return RedirectResponse("/ui/", status_code=307, headers=HEADERS)


@router.get("/ui/signin")
async def signin_page(request: Request) -> Response:
    return _files(request).answer(request, "signin.html")


@router.get("/ui/static/{name}")
async def static_file(request: Request, name: str) -> Response:
    return _files(request).answer(request, name)


@router.get("/ui/signin/options")
async def signin_options(request: Request) -> JSONResponse:
    """What the sign-in page offers besides a token: the issuer's sign-in where OIDC is configured."""
    settings = request.app.state.settings
    return JSONResponse({"oidc": request.app.state.oidc is not None and bool(settings.oidc_client_id)},
                        headers=HEADERS)


@router.get("/ui/session")
async def read_session(request: Request, principal: Caller) -> JSONResponse:
    return JSONResponse(_who(principal, request.cookies.get(session.COOKIE)), headers=HEADERS)


@router.post("/ui/session")
async def sign_in(request: Request) -> JSONResponse:
    """Verify the token typed into the sign-in page and keep it in the session cookie."""
    if not session.same_origin(request.headers.get("origin"), request.headers.get("referer"),
                               request.url.scheme, request.headers.get("host")):
        raise Problem(403, "cross-origin sign-in refused")
    client = request.client.host if request.client else "unknown"
    wait_s = request.app.state.limiter.take("signin", client, 1.0, datetime.now(UTC))
    if wait_s is not None:  # a guesser is slowed per address; the tokens themselves are unguessable
        raise Problem(429, f"too many sign-in attempts; retry in {wait_s:.1f}s",
                      {"Retry-After": str(max(1, round(wait_s)))})
    token = await _typed_token(request)
    principal = await principal_of(request, token)
    max_age = request.app.state.settings.gateway_session_max_age_s
    response = JSONResponse(_who(principal, token), headers=HEADERS)
    response.headers["Set-Cookie"] = session.cookie_header(token, secure=_secure(request), max_age_s=max_age)
    return response


@router.post("/ui/session/signout", status_code=204)
async def sign_out(request: Request, principal: Caller) -> Response:
    response = Response(status_code=204, headers=HEADERS)
    response.headers["Set-Cookie"] = session.cleared_cookie_header(secure=_secure(request))
    return response


@router.get("/ui/{path:path}")
async def page(request: Request, path: str) -> Response:
    """Every other dashboard path is the one page shell; its script routes by path (a missing file under
    ``static/`` is a 404, not the shell)."""
    if path.startswith("static/") or path == "static":
        raise Problem(404, "no such dashboard file")
    return _files(request).answer(request, "index.html")


async def _typed_token(request: Request) -> str:
    body = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if kind == "application/json":
            doc = json.loads(body or b"null")
            token = doc.get("token") if isinstance(doc, dict) else None
        elif kind == "application/x-www-form-urlencoded":
            token = (parse_qs(body.decode(), max_num_fields=4).get("token") or [None])[0]
        else:
            raise Problem(415, "send the token as JSON {\"token\": ...} or as a form field 'token'")
    except (ValueError, UnicodeDecodeError):
        raise Problem(400, "the sign-in body is not readable JSON or form data") from None
    if not isinstance(token, str):
        raise Problem(400, "no token given: send {\"token\": \"<your API token>\"}")
    token = token.strip()
    problem = session.token_shape_problem(token)
    if problem is not None:
        raise Problem(400, problem)
    return token
