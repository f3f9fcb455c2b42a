"""The dashboard's session rules (pure): the cookie that carries a signed-in browser's bearer token, the
CSRF token bound to it, and which requests count as same-origin.

- The cookie holds the token the user typed, so the gateway verifies it on every request exactly as it
  verifies an ``Authorization: Bearer`` header (a revoked or expired token signs the browser out at once).
  It is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it), Secure where the
  gateway is reached over TLS, and scoped to the whole gateway (``/``: the pages call ``/v1``).
- The CSRF token is an HMAC of a fixed label keyed by the session's token: only someone who holds the
  token can compute it, the page learns it from ``GET /ui/session`` (a same-origin read), and every
  unsafe request authenticated by the cookie must send it in ``X-CSRF-Token``. A bearer header needs no
  CSRF token (a browser never adds one by itself).
- Unsafe cookie requests whose ``Origin`` (or, without it, ``Referer``) names another origin are refused
  as well: a second, independent check.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.parse import urlsplit

COOKIE = "gpusched_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MAX_TOKEN_CHARS = 8192  # a bearer token (API token or JWT) longer than this is refused unread
_CSRF_LABEL = b"gpusched dashboard csrf v1"


def csrf_token(session_token: str) -> str:
    digest = hmac.new(session_token.encode(), _CSRF_LABEL, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def csrf_matches(session_token: str, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(csrf_token(session_token), sent or "")


def cookie_header(token: str, *, secure: bool, max_age_s: int) -> str:
    """The Set-Cookie value of a signed-in session (the token is URL-safe text: no quoting needed)."""
    return (f"{COOKIE}={token}; Max-Age={max_age_s}; Path=/; HttpOnly; SameSite=Strict"
            + ("; Secure" if secure else ""))


def cleared_cookie_header(*, secure: bool) -> str:
    return f"{COOKIE}=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def token_shape_problem(token: str) -> str | None:
    """Why this text cannot be a bearer token (None: it may be one; the store judges it)."""
    if not token:
        return "no token given"
    if len(token) > MAX_TOKEN_CHARS:
        return f"a token is at most {MAX_TOKEN_CHARS} characters"
    if any(not (33 <= ord(c) <= 126) or c in ';,"\\' for c in token):
        return "a token is printable ASCII without spaces, quotes, commas, semicolons or backslashes"
    return None


def same_origin(origin: str | None, referer: str | None, scheme: str, host: str | None) -> bool:
    """Whether an unsafe request came from a page of this gateway: its Origin (else its Referer) names
    ``scheme://host``; a request with neither (not sent by a browser's page) is let through to the CSRF
    check, which it cannot pass without the token."""
    claimed = origin if origin and origin != "null" else referer
    if origin == "null":
        return False
    if not claimed:
        return True
    parts = urlsplit(claimed)
    return bool(host) and parts.scheme == scheme and parts.netloc.lower() == (host or "").lower()


def safe_next(path: str | None) -> str:
    """Where to go after signing in: a dashboard path only (never another site: no open redirect)."""
    if path and path.startswith("/ui/") and not path.startswith("//") and "\\" not in path and "://" not in path:
        return path
    return "/ui/"
