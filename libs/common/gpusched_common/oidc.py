"""OIDC bearer tokens for the gateway: verify an identity provider's JWT and map its claims to a Principal.

A JWT is accepted only when its header names an allowed asymmetric algorithm (never ``none`` nor HS*: a
public key must never serve as an HMAC secret), its ``kid`` names a key of the issuer's JWKS that fits that
algorithm, its signature verifies, and ``iss``, ``aud``, ``exp``, ``iat`` and ``sub`` hold (``leeway_s`` of
clock skew allowed). The role and tenant then come from configured claims (``principal_from_claims``, pure).

The JWKS is fetched with ``httpx.AsyncClient`` (``jwt.PyJWKClient`` blocks on urllib) and cached. It is
refetched when older than ``jwks_refresh_s`` or when a token names an unknown ``kid`` (a rotation), but at
most once per ``refetch_min_s`` whatever the trigger, so a flood of made-up kids or an unreachable issuer
cannot make every request hit the issuer. While a refetch fails, the last good key set stays in use: an
identity provider's outage should not lock everyone out. A refusal says why and never echoes the token.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

import httpx
import jwt

from gpusched_common.ids import is_valid_id
from gpusched_common.tokens import TENANT_ROLES
from gpusched_core.access.principal import Principal, Role

log = logging.getLogger(__name__)

_JWT = re.compile(r"^[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*$")  # unsigned (alg none): empty third
_MAX_TOKEN_CHARS = 16384  # far above any real ID/access token; refuses junk before decoding it
_ASYMMETRIC = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                         "ES256", "ES384", "ES512", "ES256K", "EdDSA"})
_SIGNING_KTYS = frozenset({"RSA", "EC", "OKP"})  # "oct" keys are HMAC secrets: never taken from a JWKS
_POWER = (Role.OPERATOR, Role.TENANT_ADMIN, Role.USER, Role.VIEWER)  # most powerful first
_HTTP_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class OidcConfig:
    issuer: str  # exactly the ``iss`` of the tokens, e.g. https://idp.example.com/realms/gpu
    audience: str  # the ``aud`` that names the gateway (the client id at the identity provider)
    jwks_url: str | None = None  # None: discovered from {issuer}/.well-known/openid-configuration
    subject_claim: str = "sub"
    tenant_claim: str = "gpusched_tenant"  # a string, or a list of strings (groups)
    role_claim: str = "gpusched_role"  # a string, or a list of strings; values that name no Role are ignored
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    leeway_s: float = 30.0
    jwks_refresh_s: float = 300.0
    refetch_min_s: float = 30.0  # the least time between two JWKS fetches, whatever triggers them

    def __post_init__(self) -> None:
        if urlsplit(self.issuer).scheme not in ("https", "http") or not urlsplit(self.issuer).netloc:
            raise ValueError(f"OIDC issuer must be an http(s) URL, got {self.issuer!r}")
        if not self.audience:
            raise ValueError("OIDC audience must be given")
        unsafe = [alg for alg in self.algorithms if alg not in _ASYMMETRIC]
        if unsafe or not self.algorithms:
            raise ValueError(f"OIDC algorithms must be asymmetric ones of {sorted(_ASYMMETRIC)}, got {unsafe}")
        if self.leeway_s < 0 or self.jwks_refresh_s <= 0 or self.refetch_min_s < 0:
            raise ValueError("OIDC leeway_s and refetch_min_s must be >= 0, jwks_refresh_s > 0")

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"


class OidcRefusalReason(StrEnum):
    MALFORMED = "malformed"  # not a JWT, or its header or payload does not decode
    EXPIRED = "expired"
    WRONG_AUDIENCE = "wrong-audience"
    WRONG_ISSUER = "wrong-issuer"
    BAD_SIGNATURE = "bad-signature"  # includes a disallowed algorithm and a key that does not fit the algorithm
    UNKNOWN_KEY = "unknown-key"  # no kid, or a kid the issuer's JWKS does not hold
    CLAIMS = "claims"  # signed and current, but its claims give no usable subject, role or tenant
    JWKS_UNAVAILABLE = "jwks-unavailable"  # no key set could be fetched: the token could not be judged


@dataclass(frozen=True)
class OidcRefusal:
    reason: OidcRefusalReason
    detail: str  # for logs and the 401 body; never contains the token

    def __str__(self) -> str:
        return f"OIDC token refused: {self.reason}: {self.detail}"


def looks_like_jwt(text: str) -> bool:
    """Three base64url segments: tells a JWT from an API token (``gst_<16hex>_<43 chars>``, no dots)."""
    return isinstance(text, str) and len(text) <= _MAX_TOKEN_CHARS and bool(_JWT.match(text))


def issuer_label(issuer: str) -> str:
    """The issuer without its scheme: host, port and path, so two realms on one host stay apart."""
    parts = urlsplit(issuer)
    return f"{parts.netloc}{parts.path.rstrip('/')}"


def subject_of(issuer: str, sub: str) -> str:
    """``oidc:<issuer host/path>/<sub>``: cannot collide with API token subjects (``token:<id>[:name]``)."""
    return f"oidc:{issuer_label(issuer)}/{sub}"


def _strings(value: object) -> list[str] | None:
    """A claim that may be one string or a list of strings, as a list; None when it is neither."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(dict.fromkeys(value))
    return None


def _binding_problem(role: Role, tenants: list[str] | None, tenant_claim: str) -> str | None:
    """Why ``role`` cannot be granted with these tenants (None: it can): user and tenant-admin are bound to
    exactly one valid tenant; viewer and operator to none (their tenant claim is ignored)."""
    if role not in TENANT_ROLES:
        return None
    if tenants is None:
        return f"claim {tenant_claim!r} is not a string or list of strings"
    if len(tenants) != 1:
        return f"role {role} needs exactly one tenant in claim {tenant_claim!r}, got {len(tenants)}"
    if not is_valid_id(tenants[0]):
        return f"role {role}: claim {tenant_claim!r} is not a valid tenant id"
    return None


def principal_from_claims(claims: Mapping[str, Any], config: OidcConfig) -> Principal | OidcRefusal:
    """The principal verified claims grant: the most powerful listed role whose binding rule the tenant claim
    keeps (operator > tenant-admin > user > viewer). A role that cannot be bound is passed over for a lesser
    listed one, never widened: ``[tenant-admin, viewer]`` with two tenants grants viewer, the one role the
    identity provider gave that means something here. No usable role: refused, saying why."""
    sub = claims.get(config.subject_claim)
    if not isinstance(sub, str) or not sub.strip() or len(sub) > 255:
        return OidcRefusal(OidcRefusalReason.CLAIMS, f"claim {config.subject_claim!r} is not a usable subject")
    listed, tenants = _strings(claims.get(config.role_claim)), _strings(claims.get(config.tenant_claim))
    if listed is None:
        return OidcRefusal(OidcRefusalReason.CLAIMS, f"claim {config.role_claim!r} is not a string or list of strings")
    roles = [role for role in _POWER if role.value in listed]
    if not roles:
        return OidcRefusal(OidcRefusalReason.CLAIMS,
                           f"claim {config.role_claim!r} names no role of {', '.join(r.value for r in Role)}")
    problems = []
    for role in roles:
        problem = _binding_problem(role, tenants, config.tenant_claim)
        if problem is None:
            tenant = tenants[0] if role in TENANT_ROLES and tenants else None
            return Principal(subject_of(config.issuer, sub), role, tenant)
        problems.append(problem)
    return OidcRefusal(OidcRefusalReason.CLAIMS, "; ".join(problems))


# First match wins: an InvalidSignatureError is also a DecodeError (which, unlisted, means malformed).
_ERROR_REASONS: tuple[tuple[type[jwt.PyJWTError], OidcRefusalReason, str], ...] = (
    (jwt.ExpiredSignatureError, OidcRefusalReason.EXPIRED, "the token has expired"),
    (jwt.InvalidAudienceError, OidcRefusalReason.WRONG_AUDIENCE, "the token is not for this audience"),
    (jwt.InvalidIssuerError, OidcRefusalReason.WRONG_ISSUER, "the token is from another issuer"),
    (jwt.InvalidSignatureError, OidcRefusalReason.BAD_SIGNATURE, "the signature does not verify"),
    (jwt.InvalidAlgorithmError, OidcRefusalReason.BAD_SIGNATURE, "the algorithm does not fit the key"),
    (jwt.ImmatureSignatureError, OidcRefusalReason.CLAIMS, "the token is not valid yet (nbf)"),
    (jwt.InvalidIssuedAtError, OidcRefusalReason.CLAIMS, "the token is issued in the future (iat)"),
    (jwt.exceptions.InvalidSubjectError, OidcRefusalReason.CLAIMS, "claim 'sub' is not a string"),
)


def refusal_of(error: jwt.PyJWTError) -> OidcRefusal:
    """What a PyJWT error means for the caller; anything unlisted is a token that does not decode."""
    if isinstance(error, jwt.MissingRequiredClaimError):
        missing = {"aud": OidcRefusalReason.WRONG_AUDIENCE, "iss": OidcRefusalReason.WRONG_ISSUER}
        return OidcRefusal(missing.get(error.claim, OidcRefusalReason.CLAIMS), f"claim {error.claim!r} is missing")
    for kind, reason, detail in _ERROR_REASONS:
        if isinstance(error, kind):
            return OidcRefusal(reason, detail)
    return OidcRefusal(OidcRefusalReason.MALFORMED, f"the token does not decode ({type(error).__name__})")


def signing_keys(jwks: object) -> dict[str, list[dict[str, Any]]]:
    """The JWKS's signature keys by kid. Skipped: keys without a kid (tokens are matched by kid), keys for
    encryption, and symmetric ("oct") keys, which a JWKS has no business publishing."""
    keys = jwks.get("keys") if isinstance(jwks, dict) else None
    if not isinstance(keys, list):
        raise ValueError("the JWKS has no 'keys' list")
    found: dict[str, list[dict[str, Any]]] = {}
    for key in keys:
        if (isinstance(key, dict) and isinstance(key.get("kid"), str) and key.get("kty") in _SIGNING_KTYS
                and key.get("use", "sig") == "sig"):
            found.setdefault(key["kid"], []).append(key)
    return found


def key_for(candidates: list[dict[str, Any]], alg: str) -> jwt.PyJWK | None:
    """The first candidate that can verify ``alg``: its own ``alg``, when it states one, must be ``alg``, and
    its key type must fit it (an RSA key never verifies ES256)."""
    for jwk in candidates:
        if jwk.get("alg", alg) != alg:
            continue
        try:
            return jwt.PyJWK(jwk, algorithm=alg)
        except jwt.PyJWTError:
            continue
    return None


def fetch_due(*, has_keys: bool, kid_known: bool, age_s: float, since_attempt_s: float | None,
              config: OidcConfig) -> bool:
    """Whether to fetch the JWKS now: none yet, too old, or an unknown kid (a rotation), and no fetch
    attempted in the last ``refetch_min_s``: the one limit that keeps junk tokens off the issuer."""
    wanted = not has_keys or not kid_known or age_s >= config.jwks_refresh_s
    return wanted and (since_attempt_s is None or since_attempt_s >= config.refetch_min_s)


class _Unavailable(Exception):
    """A JWKS fetch failed; its message is the refusal's detail."""


class OidcVerifier:
    """Verifies bearer JWTs of one issuer; holds that issuer's cached key set."""

    def __init__(self, config: OidcConfig, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self._http = http or httpx.AsyncClient(timeout=_HTTP_TIMEOUT_S, follow_redirects=False)
        self._owns_http = http is None
        self._jwks_url = config.jwks_url
        self._keys: dict[str, list[dict[str, Any]]] | None = None
        self._built: dict[tuple[str, str], jwt.PyJWK] = {}
        self._fetched_at = 0.0
        self._attempted_at: float | None = None
        self._fetches = 0  # fetches ended, failed or not
        self._last_failure = "no JWKS fetched yet"
        self._lock = asyncio.Lock()  # one fetch at a time; waiters reuse its result

    async def verify(self, token: str) -> Principal | OidcRefusal:
        """The principal a bearer JWT proves, or why it is refused. Never raises for a bad token or an
        unreachable issuer."""
        if not looks_like_jwt(token):
            return OidcRefusal(OidcRefusalReason.MALFORMED, "not a JWT (three base64url segments)")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            return OidcRefusal(OidcRefusalReason.MALFORMED, "the JWT header does not decode")
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in self.config.algorithms:
            shown = alg if isinstance(alg, str) and len(alg) <= 16 else "?"
            return OidcRefusal(OidcRefusalReason.BAD_SIGNATURE, f"algorithm {shown!r} is not allowed")
        if not isinstance(kid, str) or not kid or len(kid) > 256:
            return OidcRefusal(OidcRefusalReason.UNKNOWN_KEY, "the JWT header names no usable key id (kid)")
        key = await self._key(kid, alg)
        if isinstance(key, OidcRefusal):
            return key
        try:
            claims = jwt.decode(token, key, algorithms=[alg], audience=self.config.audience,
                                issuer=self.config.issuer, leeway=self.config.leeway_s,
                                options={"require": ["exp", "iat", "sub"]})
        except jwt.PyJWTError as error:
            return refusal_of(error)
        return principal_from_claims(claims, self.config)

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def _key(self, kid: str, alg: str) -> jwt.PyJWK | OidcRefusal:
        now = time.monotonic()
        missing = self._keys is None or kid not in self._keys
        due = fetch_due(has_keys=self._keys is not None, kid_known=not missing, age_s=now - self._fetched_at,
                        since_attempt_s=None if self._attempted_at is None else now - self._attempted_at,
                        config=self.config)
        if due or (missing and self._lock.locked()):  # a fetch under way may bring the key: wait for it
            await self._refresh(self._fetches, fetch=due)
        if self._keys is None:
            return OidcRefusal(OidcRefusalReason.JWKS_UNAVAILABLE, self._last_failure)
        if kid not in self._keys:
            return OidcRefusal(OidcRefusalReason.UNKNOWN_KEY, f"the issuer's JWKS holds no key {kid[:64]!r}")
        if (kid, alg) not in self._built:
            built = key_for(self._keys[kid], alg)
            if built is None:
                return OidcRefusal(OidcRefusalReason.BAD_SIGNATURE, f"key {kid[:64]!r} cannot verify {alg}")
            self._built[(kid, alg)] = built
        return self._built[(kid, alg)]

    async def _refresh(self, fetches_seen: int, *, fetch: bool) -> None:
        """Fetch the key set, unless a fetch ended while this request waited for the lock: then its result
        serves (``fetches_seen`` counts ended fetches, so concurrent cold requests share one)."""
        async with self._lock:
            if self._fetches != fetches_seen or not fetch:
                return
            self._attempted_at = time.monotonic()
            try:
                keys = signing_keys(await self._get_json(await self._resolved_jwks_url()))
            except (_Unavailable, ValueError) as error:  # ValueError: a JWKS without a 'keys' list
                self._last_failure = str(error)
                log.warning("OIDC JWKS fetch failed (%s); %s", error,
                            "keeping the last key set" if self._keys is not None else "no key set yet")
                return
            finally:
                self._fetches += 1
            self._keys, self._built, self._fetched_at = keys, {}, time.monotonic()

    async def _resolved_jwks_url(self) -> str:
        if self._jwks_url is None:
            discovery = await self._get_json(self.config.discovery_url)
            if not isinstance(discovery, dict) or discovery.get("issuer") != self.config.issuer:
                raise _Unavailable("the discovery document names another issuer")  # OIDC Discovery 1.0, 4.3
            jwks_uri = discovery.get("jwks_uri")
            if not isinstance(jwks_uri, str) or urlsplit(jwks_uri).scheme not in ("https", "http"):
                raise _Unavailable("the discovery document has no usable jwks_uri")
            self._jwks_url = jwks_uri
        return self._jwks_url

    async def _get_json(self, url: str) -> object:
        try:
            response = await self._http.get(url, headers={"Accept": "application/json"})
            response.raise_for_status()
            return response.json()
        except httpx.HTTPError as error:
            raise _Unavailable(f"cannot fetch {url}: {type(error).__name__}") from None
        except ValueError:
            raise _Unavailable(f"{url} did not return JSON") from None
