"""OIDC bearer tokens against a real HTTP identity provider on loopback (discovery document and JWKS):
valid tokens map to principals, every kind of bad token is refused with its reason, keys rotate, and an
unreachable issuer is a refusal, not an exception. Plus the claims mapping as a table."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from gpusched_common.infra.processes import free_port
from gpusched_common.oidc import (
    OidcConfig,
    OidcRefusal,
    OidcRefusalReason,
    OidcVerifier,
    looks_like_jwt,
    principal_from_claims,
)
from gpusched_core.access.principal import Principal, Role

AUDIENCE = "gpusched-gateway"
R = OidcRefusalReason


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


KEYS = {"main": rsa_key(), "other": rsa_key(), "next": rsa_key(),
        "ec": ec.generate_private_key(ec.SECP256R1()), "ed": ed25519.Ed25519PrivateKey.generate()}


def public_jwk(key: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = {"RS256": jwt.algorithms.RSAAlgorithm, "ES256": jwt.algorithms.ECAlgorithm,
                 "EdDSA": jwt.algorithms.OKPAlgorithm}[alg]
    return {**algorithm.to_jwk(key.public_key(), as_dict=True), "kid": kid, "alg": alg, "use": "sig"}


class IdentityProvider:
    """A discovery document and a JWKS served over real HTTP; counts the JWKS fetches. Also the
    authorization-code flow with PKCE for a browser sign-in: ``/authorize`` signs in ``login_claims``'
    user at once (no login form) and redirects back with a one-use code; ``/token`` redeems it for an ID
    token when the PKCE verifier and redirect URI match what ``/authorize`` saw."""

    def __init__(self) -> None:
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.jwks: dict[str, Any] = {"keys": [public_jwk(KEYS["main"], "k1", "RS256"),
                                              public_jwk(KEYS["ec"], "ec1", "ES256"),
                                              public_jwk(KEYS["ed"], "ed1", "EdDSA")]}
        self.jwks_requests = 0
        self.discovery_issuer = self.issuer
        self.login_claims: dict[str, Any] = {"sub": "u-1"}
        self.codes: dict[str, dict[str, str]] = {}
        self.tamper_nonce = False
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._running = False

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        idp = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.startswith("/authorize?"):
                    self._authorize()
                    return
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": idp.discovery_issuer, "jwks_uri": f"{idp.issuer}/jwks",
                            "authorization_endpoint": f"{idp.issuer}/authorize", "token_endpoint": f"{idp.issuer}/token"}
                elif self.path == "/jwks":
                    idp.jwks_requests += 1
                    body = idp.jwks
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorize(self) -> None:
                asked = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                code = secrets.token_urlsafe(16)
                idp.codes[code] = asked
                self.send_response(302)
                self.send_header("Location", f"{asked['redirect_uri']}?{urlencode({'code': code, 'state': asked['state']})}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
                asked = idp.codes.pop(form.get("code", ""), None)
                challenge = base64.urlsafe_b64encode(hashlib.sha256(form.get("code_verifier", "").encode()).digest())
                if self.path != "/token" or asked is None or form.get("redirect_uri") != asked["redirect_uri"] or (
                        challenge.rstrip(b"=").decode() != asked.get("code_challenge")):
                    status, body = 400, {"error": "invalid_grant"}
                else:
                    now = int(time.time())
                    claims = {"iss": idp.issuer, "aud": asked["client_id"], "iat": now, "exp": now + 300,
                              "nonce": "other" if idp.tamper_nonce else asked["nonce"], **idp.login_claims}
                    status, body = 200, {"token_type": "Bearer", "id_token": jwt.encode(
                        claims, KEYS["main"], algorithm="RS256", headers={"kid": "k1"})}
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()
        self._running = True

    def stop(self) -> None:
        if self._running:
            self._running = False
            self._server.shutdown()
            self._server.server_close()

    def config(self, **overrides: Any) -> OidcConfig:
        return OidcConfig(**{"issuer": self.issuer, "audience": AUDIENCE, **overrides})


@pytest.fixture
def idp() -> Iterator[IdentityProvider]:
    provider = IdentityProvider()
    provider.start()
    yield provider
    provider.stop()


@pytest.fixture
async def verifier(idp: IdentityProvider):
    checker = OidcVerifier(idp.config())
    yield checker
    await checker.close()


def claims_of(idp: IdentityProvider, **overrides: Any) -> dict[str, Any]:
    """A user of tenant research, valid for five minutes; an override of None drops that claim."""
    now = int(time.time())
    claims = {"iss": idp.issuer, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300,
              "gpusched_role": "user", "gpusched_tenant": "research", **overrides}
    return {name: value for name, value in claims.items() if value is not None}


def a_token(idp: IdentityProvider, key: str = "main", kid: str = "k1", alg: str = "RS256", **claims: Any) -> str:
    return jwt.encode(claims_of(idp, **claims), KEYS[key], algorithm=alg, headers={"kid": kid})


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hs256_with_public_key(idp: IdentityProvider) -> str:
    """The algorithm-confusion attack: HS256 keyed with the issuer's public key PEM (PyJWT refuses to make
    one, so it is built by hand)."""
    secret = KEYS["main"].public_key().public_bytes(serialization.Encoding.PEM,
                                                    serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': 'k1'}).encode())}." \
                    f"{b64(json.dumps(claims_of(idp)).encode())}"
    return f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


def tampered(token: str, claims: dict[str, Any]) -> str:
    header, _, signature = token.split(".")
    return f"{header}.{b64(json.dumps(claims).encode())}.{signature}"


def subject(idp: IdentityProvider, sub: str = "alice") -> str:
    return f"oidc:127.0.0.1:{idp.port}/{sub}"


async def test_a_valid_token_of_a_user_gives_that_user_bound_to_its_tenant(idp, verifier):
    assert await verifier.verify(a_token(idp)) == Principal(subject(idp), Role.USER, "research")


async def test_an_operator_token_gives_an_operator_bound_to_no_tenant(idp, verifier):
    token = a_token(idp, gpusched_role="operator", gpusched_tenant="research")
    assert await verifier.verify(token) == Principal(subject(idp), Role.OPERATOR, None)


async def test_roles_given_as_a_groups_list_take_the_most_powerful_gpusched_role(idp, verifier):
    token = a_token(idp, gpusched_role=["staff", "user", "tenant-admin"], gpusched_tenant=["research"])
    assert await verifier.verify(token) == Principal(subject(idp), Role.TENANT_ADMIN, "research")


@pytest.mark.parametrize(("key", "kid", "alg"), [("ec", "ec1", "ES256"), ("ed", "ed1", "EdDSA")])
async def test_elliptic_curve_and_edwards_keys_verify_too(idp, verifier, key, kid, alg):
    assert await verifier.verify(a_token(idp, key, kid, alg)) == Principal(subject(idp), Role.USER, "research")


async def test_a_token_expired_within_the_leeway_is_still_accepted(idp, verifier):
    token = a_token(idp, iat=int(time.time()) - 600, exp=int(time.time()) - 10)
    assert isinstance(await verifier.verify(token), Principal)


def refused_tokens(idp: IdentityProvider) -> list[tuple[str, str, OidcRefusalReason]]:
    now = int(time.time())
    return [
        ("wrong audience", a_token(idp, aud="another-service"), R.WRONG_AUDIENCE),
        ("no audience", a_token(idp, aud=None), R.WRONG_AUDIENCE),
        ("wrong issuer", a_token(idp, iss="https://evil.example"), R.WRONG_ISSUER),
        ("expired", a_token(idp, iat=now - 900, exp=now - 120), R.EXPIRED),
        ("no exp", a_token(idp, exp=None), R.CLAIMS),
        ("issued in the future", a_token(idp, iat=now + 600), R.CLAIMS),
        ("other key, same kid", a_token(idp, key="other"), R.BAD_SIGNATURE),
        ("other key, unknown kid", a_token(idp, key="other", kid="k9"), R.UNKNOWN_KEY),
        ("no kid", jwt.encode(claims_of(idp), KEYS["main"], algorithm="RS256"), R.UNKNOWN_KEY),
        ("alg none", jwt.encode(claims_of(idp), None, algorithm="none", headers={"kid": "k1"}), R.BAD_SIGNATURE),
        ("HS256 keyed with the public key", hs256_with_public_key(idp), R.BAD_SIGNATURE),
        ("EC signature under the RSA key's kid", a_token(idp, key="ec", alg="ES256"), R.BAD_SIGNATURE),
        ("tampered signature", a_token(idp)[:-8] + "AAAAAAAA", R.BAD_SIGNATURE),
        ("tampered payload", tampered(a_token(idp), claims_of(idp, gpusched_role="operator")), R.BAD_SIGNATURE),
        ("missing role claim", a_token(idp, gpusched_role=None), R.CLAIMS),
        ("user without tenant", a_token(idp, gpusched_tenant=None), R.CLAIMS),
        ("not a JWT", "gst_0123456789abcdef_" + "x" * 43, R.MALFORMED),
        ("header not JSON", f"{b64(b'nope')}.{b64(b'{}')}.{b64(b'sig')}", R.MALFORMED),
    ]


async def test_each_bad_token_is_refused_with_its_reason_and_the_detail_never_echoes_it(idp, verifier):
    for name, token, reason in refused_tokens(idp):
        refusal = await verifier.verify(token)
        assert isinstance(refusal, OidcRefusal), name
        assert refusal.reason == reason, (name, refusal)
        assert not any(part and part in refusal.detail for part in [token, *token.split(".")]), name


async def test_a_rotated_key_verifies_after_the_refetch_and_the_retired_one_no_longer_does(idp):
    verifier = OidcVerifier(idp.config(refetch_min_s=0))
    try:
        assert isinstance(await verifier.verify(a_token(idp)), Principal)
        idp.jwks = {"keys": [public_jwk(KEYS["next"], "k2", "RS256")]}
        assert await verifier.verify(a_token(idp, "next", "k2")) == Principal(subject(idp), Role.USER, "research")
        assert idp.jwks_requests == 2
        assert (await verifier.verify(a_token(idp))).reason == R.UNKNOWN_KEY
    finally:
        await verifier.close()


async def test_a_flood_of_unknown_kids_fetches_the_jwks_at_most_once_per_refetch_interval(idp, verifier):
    assert isinstance(await verifier.verify(a_token(idp)), Principal)
    for n in range(25):
        assert (await verifier.verify(a_token(idp, key="other", kid=f"junk-{n}"))).reason == R.UNKNOWN_KEY
    assert idp.jwks_requests == 1


async def test_concurrent_first_requests_share_one_jwks_fetch(idp, verifier):
    results = await asyncio.gather(*(verifier.verify(a_token(idp)) for _ in range(20)))
    assert all(isinstance(result, Principal) for result in results)
    assert idp.jwks_requests == 1


async def test_an_unreachable_jwks_is_a_refusal_not_an_exception():
    down = f"http://127.0.0.1:{free_port()}"
    for config in (OidcConfig(issuer=down, audience=AUDIENCE),  # discovery down
                   OidcConfig(issuer="https://idp.example", audience=AUDIENCE, jwks_url=f"{down}/jwks")):
        verifier = OidcVerifier(config)
        try:
            token = jwt.encode({"sub": "alice"}, KEYS["main"], algorithm="RS256", headers={"kid": "k1"})
            refusal = await verifier.verify(token)
            assert isinstance(refusal, OidcRefusal) and refusal.reason == R.JWKS_UNAVAILABLE
            assert "127.0.0.1" in refusal.detail
        finally:
            await verifier.close()


async def test_a_discovery_document_naming_another_issuer_is_not_trusted(idp, verifier):
    idp.discovery_issuer = "https://evil.example"
    assert (await verifier.verify(a_token(idp))).reason == R.JWKS_UNAVAILABLE
    assert idp.jwks_requests == 0


async def test_the_last_key_set_stays_in_use_while_the_issuer_is_down(idp):
    verifier = OidcVerifier(idp.config(jwks_refresh_s=0.01, refetch_min_s=0))
    try:
        assert isinstance(await verifier.verify(a_token(idp)), Principal)
        idp.stop()
        await asyncio.sleep(0.05)
        assert isinstance(await verifier.verify(a_token(idp)), Principal)
        assert (await verifier.verify(a_token(idp, key="other", kid="k9"))).reason == R.UNKNOWN_KEY
    finally:
        await verifier.close()


def test_looks_like_jwt_tells_jwts_from_api_tokens():
    assert looks_like_jwt(jwt.encode({"sub": "a"}, KEYS["main"], algorithm="RS256"))
    assert not looks_like_jwt("gst_0123456789abcdef_" + "A" * 43)
    assert not looks_like_jwt("a.b") and not looks_like_jwt("") and not looks_like_jwt("x" * 20000)


@pytest.mark.parametrize("algorithms", [("HS256",), ("none",), ("RS256", "HS512"), ()])
def test_symmetric_or_no_algorithms_are_refused_in_the_config(algorithms):
    with pytest.raises(ValueError):
        OidcConfig(issuer="https://idp.example", audience=AUDIENCE, algorithms=algorithms)


CONFIG = OidcConfig(issuer="https://idp.example/realms/gpu", audience=AUDIENCE)
ALICE = "oidc:idp.example/realms/gpu/alice"
CLAIM_TABLE = [
    ("user of one tenant", {"gpusched_role": "user", "gpusched_tenant": "research"},
     Principal(ALICE, Role.USER, "research")),
    ("tenant-admin, tenant as a one-item list", {"gpusched_role": "tenant-admin", "gpusched_tenant": ["research"]},
     Principal(ALICE, Role.TENANT_ADMIN, "research")),
    ("operator: tenant ignored", {"gpusched_role": "operator", "gpusched_tenant": ["a", "b"]},
     Principal(ALICE, Role.OPERATOR)),
    ("viewer: tenant ignored", {"gpusched_role": "viewer", "gpusched_tenant": "research"},
     Principal(ALICE, Role.VIEWER)),
    ("groups list: unknown groups ignored", {"gpusched_role": ["staff", "viewer", "user"], "gpusched_tenant": "r1"},
     Principal(ALICE, Role.USER, "r1")),
    ("operator outranks tenant-admin", {"gpusched_role": ["tenant-admin", "operator"], "gpusched_tenant": "r1"},
     Principal(ALICE, Role.OPERATOR)),
    ("unbindable tenant-admin falls to a listed viewer",
     {"gpusched_role": ["tenant-admin", "viewer"], "gpusched_tenant": ["a", "b"]}, Principal(ALICE, Role.VIEWER)),
    ("duplicated tenant counts once", {"gpusched_role": "user", "gpusched_tenant": ["r1", "r1"]},
     Principal(ALICE, Role.USER, "r1")),
    ("user without tenant", {"gpusched_role": "user"}, R.CLAIMS),
    ("user with two tenants", {"gpusched_role": "user", "gpusched_tenant": ["a", "b"]}, R.CLAIMS),
    ("user with an invalid tenant id", {"gpusched_role": "user", "gpusched_tenant": "no spaces"}, R.CLAIMS),
    ("user with a non-string tenant", {"gpusched_role": "user", "gpusched_tenant": 7}, R.CLAIMS),
    ("no role claim", {"gpusched_tenant": "research"}, R.CLAIMS),
    ("no gpusched role among groups", {"gpusched_role": ["admin", "staff"]}, R.CLAIMS),
    ("role claim not a string", {"gpusched_role": 42}, R.CLAIMS),
    ("role list with a non-string", {"gpusched_role": ["user", 1], "gpusched_tenant": "r1"}, R.CLAIMS),
    ("empty subject", {"sub": " ", "gpusched_role": "operator"}, R.CLAIMS),
]


@pytest.mark.parametrize(("claims", "expected"), [pytest.param(c, e, id=name) for name, c, e in CLAIM_TABLE])
def test_principal_from_claims(claims, expected):
    result = principal_from_claims({"sub": "alice", **claims}, CONFIG)
    if isinstance(expected, Principal):
        assert result == expected
    else:
        assert isinstance(result, OidcRefusal) and result.reason == expected, result


def test_claim_names_are_configurable():
    config = OidcConfig(issuer="https://idp.example", audience=AUDIENCE, subject_claim="email",
                        role_claim="groups", tenant_claim="tenants")
    claims = {"sub": "x", "email": "bob@example.com", "groups": ["user"], "tenants": ["vision"]}
    assert principal_from_claims(claims, config) == Principal("oidc:idp.example/bob@example.com", Role.USER, "vision")
