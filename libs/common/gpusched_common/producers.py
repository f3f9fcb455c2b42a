"""Credentialed producers: programs that publish ``JobSubmitted`` on ``gpusched.jobs.submitted`` themselves
(the gateway is one), each with its own Ed25519 key, bound to the tenants it may submit for (migration 018).

A producer's key is ``gsk_<id>_<secret>``: ``id`` is 16 random hex digits, public (the row's key, sent in
the ``gpusched-producer`` header); ``secret`` is the 32-byte Ed25519 private key, urlsafe base64 (43
characters), shown once when the producer is created. The store keeps only the public key: reading the
table lets no one sign. Each message carries ``gpusched-producer-signature``, the Ed25519 signature of the
message's bytes, so nothing of it (tenant, spec, the attested subject) can be changed in flight.

Admission verifies every submission (``verify``): the producer must exist, be unrevoked, its signature
must hold, and the spec's tenant must be one of its tenants (``*``: any). Who submitted is the principal
the producer attests in ``submitted_by`` when it may attest (the gateway, for the caller it
authenticated), else the producer itself (``producer:<name>``). Revocation is read by the next message.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import asyncpg
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gpusched_common.files import write_private
from gpusched_common.identity import OPERATOR, Verdict
from gpusched_common.ids import is_valid_id

PREFIX = "gsk_"
PRODUCER_HEADER = "gpusched-producer"
SIGNATURE_HEADER = "gpusched-producer-signature"
_KEY = re.compile(r"^gsk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_ID = re.compile(r"^[0-9a-f]{16}$")
MAX_SUBJECT_CHARS = 256
_COLUMNS = "producer_id, name, tenants, attests, created_at, created_by, revoked_at"


@dataclass(frozen=True)
class ProducerKey:
    """A producer's signing key (never printed: ``repr`` hides the private half)."""

    producer_id: str
    private: Ed25519PrivateKey = field(repr=False)

    def public_key(self) -> bytes:
        return self.private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    def public_key_text(self) -> str:
        """The public key as text (urlsafe base64): what an agent is given to recognise this producer."""
        return b64(self.public_key())

    def request_headers(self, method: str, target: str, at: float) -> dict[str, str]:
        """The headers that authenticate an HTTP request (``target``: path and query) made at ``at``."""
        return {REQUEST_TIME_HEADER: f"{at:.3f}",
                SIGNATURE_HEADER: b64(self.private.sign(request_message(method, target, f"{at:.3f}")))}

    def headers(self, value: bytes) -> dict[str, str]:
        """The two headers that authenticate ``value`` as this producer's."""
        return {PRODUCER_HEADER: self.producer_id, SIGNATURE_HEADER: b64(self.private.sign(value))}


@dataclass(frozen=True)
class ProducerInfo:
    """What may be shown of a producer (its public key is no secret, but is of no use to people)."""

    producer_id: str
    name: str
    tenants: tuple[str, ...]
    attests: bool
    created_at: datetime
    created_by: str
    revoked_at: datetime | None


@dataclass(frozen=True)
class ProducerRecord:
    """What admission judges a message by: the stored producer and its public key."""

    info: ProducerInfo
    public_key: bytes


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def parse_secret(pattern: re.Pattern[str], text: str) -> tuple[str, Ed25519PrivateKey] | None:
    """The id and Ed25519 key of a ``<prefix>_<id>_<secret>`` text ``pattern`` matches (its groups: id,
    secret), else None (the text is never echoed): producer and service keys, join tokens."""
    match = pattern.match(text.strip()) if isinstance(text, str) and len(text) < 128 else None
    if match is None:
        return None
    try:
        raw = unb64(match.group(2))
    except (binascii.Error, ValueError):
        return None
    return (match.group(1), Ed25519PrivateKey.from_private_bytes(raw)) if len(raw) == 32 else None


def parse_key(text: str) -> ProducerKey | None:
    """The signing key of a well-formed key text, else None (the text is never echoed)."""
    parsed = parse_secret(_KEY, text)
    return ProducerKey(*parsed) if parsed is not None else None


def checked_tenants(tenants: list[str] | tuple[str, ...], any_tenant: bool) -> tuple[str, ...]:
    """The tenants a new producer is bound to; ValueError saying what is wrong otherwise."""
    if any_tenant and tenants:
        raise ValueError("a producer for any tenant takes no --tenant")
    if any_tenant:
        return (OPERATOR,)
    if not tenants:
        raise ValueError("a producer needs the tenants it may submit for (--tenant T, repeated) or --all-tenants")
    bad = [t for t in tenants if not is_valid_id(t)]
    if bad:
        raise ValueError(f"invalid tenant id {bad[0]!r}")
    return tuple(sorted(set(tenants)))


async def create(conn: asyncpg.Connection, *, name: str, tenants: tuple[str, ...], attests: bool, created_by: str,
                 now: datetime) -> tuple[str, ProducerInfo]:
    """Store a new producer's public key; (its key text, to be shown once, and what may be shown of it)."""
    if not is_valid_id(name):
        raise ValueError(f"invalid producer name {name!r}: 1-128 letters, digits and ._:- starting with a letter or digit")
    if not tenants or any(t != OPERATOR and not is_valid_id(t) for t in tenants):
        raise ValueError(f"invalid tenants {list(tenants)!r}")
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    producer_id = secrets.token_hex(8)
    try:
        row = await conn.fetchrow(
            "INSERT INTO producers (producer_id, name, tenants, attests, public_key, created_at, created_by)"
            f" VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {_COLUMNS}",
            producer_id, name, list(tenants), attests, public, now, created_by)
    except asyncpg.UniqueViolationError:
        raise ValueError(f"a producer named {name!r} exists already (see `gpusched producers list`)") from None
    raw = private.private_bytes_raw()
    return f"{PREFIX}{producer_id}_{b64(raw)}", _info(row)


async def list_producers(conn: asyncpg.Connection) -> list[ProducerInfo]:
    return [_info(r) for r in await conn.fetch(f"SELECT {_COLUMNS} FROM producers ORDER BY created_at, producer_id")]


async def revoke(conn: asyncpg.Connection, producer_id: str, now: datetime) -> bool:
    """Revoke a producer; False when there is no such producer or it was revoked already."""
    status = await conn.execute(
        "UPDATE producers SET revoked_at = $2 WHERE producer_id = $1 AND revoked_at IS NULL", producer_id, now)
    return status == "UPDATE 1"


def parse_producer_id(text: str) -> str | None:
    return text if isinstance(text, str) and _ID.match(text) else None


async def load(conn: asyncpg.Connection, producer_id: str) -> ProducerRecord | None:
    if parse_producer_id(producer_id) is None:
        return None
    row = await conn.fetchrow(f"SELECT {_COLUMNS}, public_key FROM producers WHERE producer_id = $1", producer_id)
    return ProducerRecord(_info(row), bytes(row["public_key"])) if row is not None else None


def signature_holds(record: ProducerRecord, signature: str, value: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(record.public_key).verify(unb64(signature), value)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def judge(producer_id: str, record: ProducerRecord | None, signed: bool, tenant: str | None,
          attested: str | None, *, must_attest: bool = False) -> Verdict:
    """The verdict on a message that ``producer_id`` signed (pure): ``signed`` is whether the signature
    holds over its bytes, ``tenant`` the spec's tenant, ``attested`` the subject it names in
    ``submitted_by``. Unknown and revoked producers and bad signatures are refused before any tenant is
    looked at; the tenant must be one of the producer's."""
    if record is None:
        return Verdict(None, f"unknown producer {producer_id!r}")
    info = record.info
    if info.revoked_at is not None:
        return Verdict(None, f"producer {info.name!r} ({producer_id}) is revoked")
    if not signed:
        return Verdict(None, f"producer {info.name!r} ({producer_id}): the signature does not match the submission")
    if must_attest and not (info.attests and attested):
        return Verdict(None, f"producer {info.name!r} may not send this message: only a producer that attests "
                             "the principal it acts for (the gateway) may", authenticated=True)
    if tenant is None or (OPERATOR not in info.tenants and tenant not in info.tenants):
        return Verdict(None, f"producer {info.name!r} may not submit for tenant {tenant!r} "
                             f"(its tenants: {', '.join(info.tenants)})", authenticated=True)
    if info.attests and attested:
        if len(attested) > MAX_SUBJECT_CHARS or not attested.isprintable():
            return Verdict(None, f"producer {info.name!r} attests a subject that is not printable text of at most "
                                 f"{MAX_SUBJECT_CHARS} characters")
        return Verdict(tenant, None, subject=attested, producer=producer_id)
    return Verdict(tenant, None, subject=f"producer:{info.name}", producer=producer_id)


async def verify(conn: asyncpg.Connection, headers: dict[str, str], value: bytes, tenant: str | None,
                 attested: str | None, *, must_attest: bool = False,
                 known: dict[str, ProducerRecord | None] | None = None) -> Verdict:
    """The verdict on a message carrying ``gpusched-producer`` (read from the store: revocation is at once);
    ``must_attest``: only a producer that attests its principal may send it (control requests). ``known``:
    the records this transaction has read already (a batch's messages mostly come from one producer, the
    gateway: read once per batch, not once per message); filled as it reads."""
    producer_id = headers.get(PRODUCER_HEADER, "")
    signature = headers.get(SIGNATURE_HEADER)
    if not signature:
        return Verdict(None, f"producer {producer_id!r}: no {SIGNATURE_HEADER} header")
    if known is not None and producer_id in known:
        record = known[producer_id]
    else:
        record = await load(conn, producer_id)
        if known is not None:
            known[producer_id] = record
    signed = record is not None and signature_holds(record, signature, value)
    return judge(producer_id, record, signed, tenant, attested, must_attest=must_attest)


def read_key_file(path: Path) -> ProducerKey | None:
    """The key in ``path`` (None: no file, or not a producer key)."""
    try:
        return parse_key(path.read_text())
    except (FileNotFoundError, UnicodeDecodeError):
        return None


async def ensure(conn: asyncpg.Connection, key_file: Path, *, name: str, tenants: tuple[str, ...], attests: bool,
                 created_by: str, now: datetime) -> ProducerKey:
    """The producer whose key ``key_file`` holds, while it is stored and unrevoked; else a new producer
    (a stale one of that name is revoked and renamed aside) whose key is written to ``key_file`` (mode
    0600). Safe on every start: how a stack provisions the gateway's own producer."""
    key = read_key_file(key_file)
    record = await load(conn, key.producer_id) if key is not None else None
    if key is not None and record is not None and record.info.revoked_at is None and record.info.name == name \
            and key.public_key() == record.public_key:
        return key
    stale = await conn.fetchval("SELECT producer_id FROM producers WHERE name = $1", name)
    if stale is not None:
        await conn.execute("UPDATE producers SET revoked_at = coalesce(revoked_at, $2), name = name || '.' || $1"
                           " WHERE producer_id = $1", stale, now)
    text, _ = await create(conn, name=name, tenants=tenants, attests=attests, created_by=created_by, now=now)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    write_private(key_file, text + "\n")
    new = parse_key(text)
    assert new is not None
    return new


def _info(row: asyncpg.Record) -> ProducerInfo:
    return ProducerInfo(producer_id=row["producer_id"], name=row["name"], tenants=tuple(row["tenants"]),
                        attests=row["attests"], created_at=row["created_at"], created_by=row["created_by"],
                        revoked_at=row["revoked_at"])


# --- signed HTTP requests: how the gateway asks a node agent for a job's log --------------------------

REQUEST_TIME_HEADER = "gpusched-request-time"
MAX_REQUEST_SKEW_S = 60.0


def request_message(method: str, target: str, at: str) -> bytes:
    return f"{method.upper()}\n{target}\n{at}".encode()


def check_request(public_key: str, method: str, target: str, headers: dict[str, str], now: float) -> str | None:
    """None when the request was signed by the holder of ``public_key`` (urlsafe base64) within
    ``MAX_REQUEST_SKEW_S`` of ``now``; otherwise why not (a replayed or forged request is refused)."""
    at, signature = headers.get(REQUEST_TIME_HEADER), headers.get(SIGNATURE_HEADER)
    if not at or not signature:
        return f"unsigned request: {REQUEST_TIME_HEADER} and {SIGNATURE_HEADER} are required"
    try:
        when = float(at)
    except ValueError:
        return f"{REQUEST_TIME_HEADER} is not a time"
    if abs(now - when) > MAX_REQUEST_SKEW_S:
        return f"the request was signed {now - when:.0f}s from now (at most {MAX_REQUEST_SKEW_S:g}s)"
    try:
        Ed25519PublicKey.from_public_bytes(unb64(public_key)).verify(unb64(signature),
                                                                      request_message(method, target, at))
    except (InvalidSignature, binascii.Error, ValueError):
        return "the request's signature does not verify"
    return None
