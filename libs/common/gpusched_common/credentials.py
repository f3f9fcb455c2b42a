"""Tenant credentials: HMAC-SHA256 signatures over the submitted bytes with a per-key secret.

A key belongs to one tenant, or to `*` (an operator key that may submit for any tenant; the submission
records that it was made on the tenant's behalf). Signatures travel in Kafka headers, never in events, and
secrets are never logged: `TenantKey.__repr__` hides them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpusched_common.identity import OPERATOR, Verdict

KEY_ID_HEADER = "gpusched-key-id"
SIGNATURE_HEADER = "gpusched-signature"


@dataclass(frozen=True)
class TenantKey:
    key_id: str
    tenant: str  # a tenant name, or "*" for an operator key
    secret: bytes = field(repr=False)


def sign(secret: bytes, value: bytes) -> str:
    return hmac.new(secret, value, hashlib.sha256).hexdigest()


def signed_headers(key: TenantKey, value: bytes) -> dict[str, str]:
    return {KEY_ID_HEADER: key.key_id, SIGNATURE_HEADER: sign(key.secret, value)}


def verify(keys: dict[str, TenantKey], headers: dict[str, str], value: bytes) -> Verdict:
    key_id = headers.get(KEY_ID_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if not key_id or not signature:
        return Verdict(None, "missing tenant credential (gpusched-key-id and gpusched-signature headers)")
    key = keys.get(key_id)
    if key is None:
        return Verdict(None, f"unknown credential key {key_id!r}")
    if not hmac.compare_digest(sign(key.secret, value), signature):
        return Verdict(None, f"credential {key_id!r} does not verify: the signature does not match the submission")
    return Verdict(key.tenant, None, subject=key_id)


def load_keys(path: Path) -> dict[str, TenantKey]:
    """`keys: {KEY_ID: {tenant: NAME or "*", secret: TEXT}}`; raises ValueError with the offending entry."""
    doc = yaml.safe_load(path.read_text()) or {}
    keys = {}
    for key_id, entry in (doc.get("keys") or {}).items():
        if not isinstance(entry, dict) or not entry.get("tenant") or not entry.get("secret"):
            raise ValueError(f"{path}: key {key_id!r} needs a tenant and a secret")
        if len(str(entry["secret"])) < 16:
            raise ValueError(f"{path}: key {key_id!r} has a secret shorter than 16 characters")
        if is_placeholder(str(entry["secret"])):
            raise ValueError(f"{path}: key {key_id!r} still has a placeholder secret; set a random one "
                             "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        keys[str(key_id)] = TenantKey(str(key_id), str(entry["tenant"]), str(entry["secret"]).encode())
    shared = [k for k in keys.values() if [o.secret for o in keys.values()].count(k.secret) > 1]
    if shared:
        raise ValueError(f"{path}: keys {', '.join(sorted(k.key_id for k in shared))} share one secret: whoever "
                         "holds it could sign as any of them; give each key its own")
    return keys


_PLACEHOLDER_WORDS = ("replace", "change", "example", "placeholder", "your-", "secret-here", "xxxx", "todo")


def is_placeholder(secret: str) -> bool:
    """A secret copied from an example file rather than generated (``replace-with-32-random-bytes``)."""
    lowered = secret.lower()
    return any(word in lowered for word in _PLACEHOLDER_WORDS) or len(set(secret)) < 6


def new_secret() -> str:
    """A random secret (32 bytes, URL-safe) that `is_placeholder` never mistakes for a copied example: about one
    in 13,000 random strings contains a word like ``todo`` and is drawn again."""
    while is_placeholder(secret := secrets.token_urlsafe(32)):
        pass
    return secret


def write_keys(path: Path, keys: list[TenantKey]) -> None:
    doc = {"keys": {k.key_id: {"tenant": k.tenant, "secret": k.secret.decode()} for k in keys}}
    path.write_text(yaml.safe_dump(doc, sort_keys=True))
    path.chmod(0o600)


def key_for(keys: dict[str, TenantKey], tenant: str) -> TenantKey | None:
    """The key a client signs with for `tenant`: the tenant's own, else an operator key."""
    own = sorted((k for k in keys.values() if k.tenant == tenant), key=lambda k: k.key_id)
    operator = sorted((k for k in keys.values() if k.tenant == OPERATOR), key=lambda k: k.key_id)
    return (own or operator or [None])[0]
