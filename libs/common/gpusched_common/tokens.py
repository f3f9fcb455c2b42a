"""API tokens that operators issue for the gateway: their format, and the store functions over
``api_tokens`` (migration 016).

A token is ``gst_<id>_<secret>``: ``id`` is 16 random hex digits, public, the row's key (it is what
``gpusched tokens list`` shows and ``revoke`` takes); ``secret`` is 32 random bytes, urlsafe base64 (43
characters). Only the SHA-256 hex of the whole token is stored; the token itself is shown once, when issued.
Verifying looks the row up by id and compares hashes in constant time; a refusal says why and never echoes
the token. Revocation is a row update that the next ``verify`` reads: effective at once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

import asyncpg

from gpusched_common.ids import is_valid_id
from gpusched_core.access.principal import Principal, Role

PREFIX = "gst_"
_TOKEN = re.compile(r"^gst_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_DURATION = re.compile(r"^([1-9][0-9]{0,5})([mhd])$")
_DURATION_UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}
TENANT_ROLES = frozenset({Role.USER, Role.TENANT_ADMIN})  # bound to one tenant; viewer and operator to none
LAST_USED_PRECISION = timedelta(minutes=1)  # last_used_at is written at most this often
_COLUMNS = "token_id, name, role, tenant, created_at, created_by, expires_at, revoked_at, last_used_at"


class RefusalReason(StrEnum):
    MALFORMED = "malformed"  # not of the gst_<id>_<secret> form
    UNKNOWN = "unknown"  # no such id, or the secret does not match (the two are not told apart)
    EXPIRED = "expired"
    REVOKED = "revoked"


@dataclass(frozen=True)
class TokenRefusal:
    reason: RefusalReason

    def __str__(self) -> str:
        return f"API token refused: {self.reason}"


@dataclass(frozen=True)
class TokenInfo:
    """What may be shown of a token: never its secret nor its hash."""

    token_id: str
    name: str | None
    role: Role
    tenant: str | None
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None


def new_token() -> tuple[str, str]:
    """(token id, token text) from the system's secure random source."""
    token_id = secrets.token_hex(8)
    return token_id, f"{PREFIX}{token_id}_{secrets.token_urlsafe(32)}"


def parse_token(text: str) -> str | None:
    """The token id of a well-formed token text, else None."""
    match = _TOKEN.match(text) if isinstance(text, str) and len(text) < 128 else None
    return match.group(1) if match else None


def token_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``: a positive whole number of days, hours or minutes."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise ValueError(f"duration must be a positive whole number of m, h or d (e.g. 90m, 12h, 30d), got {text!r}")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def checked_role(role: str, tenant: str | None, name: str | None) -> Role:
    """The role of a token request that keeps the binding rule; ValueError saying what is wrong otherwise."""
    try:
        checked = Role(role)
    except ValueError:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(r.value for r in Role)}") from None
    if checked in TENANT_ROLES and tenant is None:
        raise ValueError(f"role {checked} is bound to a tenant: give one (--tenant)")
    if checked not in TENANT_ROLES and tenant is not None:
        raise ValueError(f"role {checked} is cluster-wide and takes no tenant, got {tenant!r}")
    if tenant is not None and not is_valid_id(tenant):
        raise ValueError(f"invalid tenant id {tenant!r}")
    if name is not None and not is_valid_id(name):
        raise ValueError(f"invalid token name {name!r}: 1-128 letters, digits and ._:- starting with a letter or digit")
    return checked


def subject_of(token_id: str, name: str | None) -> str:
    return f"token:{token_id}" + (f":{name}" if name else "")


async def issue(conn: asyncpg.Connection, *, role: str, tenant: str | None, name: str | None,
                expires_at: datetime | None, created_by: str, now: datetime) -> tuple[str, TokenInfo]:
    """Store a new token's hash; (the token text, to be shown once, and what may be shown of it)."""
    checked = checked_role(role, tenant, name)
    if expires_at is not None and expires_at <= now:
        raise ValueError("a token must expire after it is issued")
    if not created_by:
        raise ValueError("created_by must name who issues the token")
    token_id, text = new_token()
    row = await conn.fetchrow(
        "INSERT INTO api_tokens (token_id, name, role, tenant, token_hash, created_at, created_by, expires_at)"
        f" VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING {_COLUMNS}",
        token_id, name, checked.value, tenant, token_hash(text), now, created_by, expires_at)
    return text, _info(row)


async def list_tokens(conn: asyncpg.Connection) -> list[TokenInfo]:
    rows = await conn.fetch(f"SELECT {_COLUMNS} FROM api_tokens ORDER BY created_at, token_id")
    return [_info(r) for r in rows]


async def revoke(conn: asyncpg.Connection, token_id: str, now: datetime) -> bool:
    """Revoke a token; False when there is no such token or it was revoked already."""
    status = await conn.execute(
        "UPDATE api_tokens SET revoked_at = $2 WHERE token_id = $1 AND revoked_at IS NULL", token_id, now)
    return status == "UPDATE 1"


async def verify(conn: asyncpg.Connection, token_text: str, now: datetime) -> Principal | TokenRefusal:
    """The principal a token stands for, or why it is refused; a use is recorded in ``last_used_at`` (to the minute)."""
    token_id = parse_token(token_text)
    if token_id is None:
        return TokenRefusal(RefusalReason.MALFORMED)
    row = await conn.fetchrow(
        "SELECT token_hash, name, role, tenant, expires_at, revoked_at, last_used_at FROM api_tokens"
        " WHERE token_id = $1", token_id)
    # the hash first: a wrong secret learns nothing about the id's token, not even that it was revoked
    if row is None or not hmac.compare_digest(token_hash(token_text), row["token_hash"]):
        return TokenRefusal(RefusalReason.UNKNOWN)
    if row["revoked_at"] is not None:
        return TokenRefusal(RefusalReason.REVOKED)
    if row["expires_at"] is not None and row["expires_at"] <= now:
        return TokenRefusal(RefusalReason.EXPIRED)
    # the use is written at most once a minute per token: a flood of requests (each then refused by a rate
    # limit) costs one primary-key read each, not a write on one hot row; conditional on not revoked, so a
    # revocation that committed since the read above still wins
    if row["last_used_at"] is None or now - row["last_used_at"] >= LAST_USED_PRECISION:
        used = await conn.fetchval(
            "UPDATE api_tokens SET last_used_at = $2 WHERE token_id = $1 AND revoked_at IS NULL RETURNING token_id",
            token_id, now)
        if used is None:
            return TokenRefusal(RefusalReason.REVOKED)
    return Principal(subject=subject_of(token_id, row["name"]), role=Role(row["role"]), tenant=row["tenant"])


def _info(row: asyncpg.Record) -> TokenInfo:
    return TokenInfo(token_id=row["token_id"], name=row["name"], role=Role(row["role"]), tenant=row["tenant"],
                     created_at=row["created_at"], created_by=row["created_by"], expires_at=row["expires_at"],
                     revoked_at=row["revoked_at"], last_used_at=row["last_used_at"])
