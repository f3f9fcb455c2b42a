"""Node identity (issue 14): every node signs what it reports with a key of its own, enrolled with an
operator's join token, and the services that read node reports believe one only when the node it names
signed it (migration 024).

- **Join tokens** (``gjt_<id>_<secret>``, like kubeadm's join tokens): an operator creates one
  (``gpusched join-token create --ttl 24h``) and gives it to the nodes it should let in. The secret is an
  Ed25519 private key: the store keeps only its public half, so reading the table lets no one enrol.
- **Enrolment**: a node without a key makes one (``<agent dir>/<node>/node.key``, mode 0600) and sends
  ``NodeEnrolmentRequested`` with its public key, signed by that key (it holds the private half) and
  vouched for by the token (``token_signature`` over ``enrolment_message``; the token never travels).
  Placement enrols it (``decide_enrolment``) when the token is known, unexpired and unrevoked and the node
  has no other live key; a node that lost its key (a wiped disk) is enrolled again only after an operator
  revoked the old one (``gpusched node-keys revoke NODE``): a token lets new nodes in, never lets anyone
  speak for a node already enrolled.
- **Verification** (``judge``): a report must be signed (``gpusched_common.signing`` headers) by a live node
  key, and the node the payload names must be the key's node: a node cannot speak for another node.
  Keys are read from the store through ``NodeKeys``, a cache whose entries live ``ttl_s`` (a revocation
  takes effect within that time).
"""

from __future__ import annotations

import binascii
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gpusched_common import events as ev
from gpusched_common import senders
from gpusched_common.ids import is_valid_id
from gpusched_common.messaging import Incoming
from gpusched_common.producers import b64, parse_secret, unb64
from gpusched_common.signing import SENDER_HEADER, SENDER_SIGNATURE_HEADER, SIGNED_AT_HEADER, signed_bytes

TOKEN_PREFIX = "gjt_"
_TOKEN = re.compile(r"^gjt_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_ENROLMENT_DOMAIN = b"gpusched-node-enrolment-v1\n"
DEFAULT_CACHE_TTL_S = 5.0


@dataclass(frozen=True)
class JoinToken:
    """A join token's signing half (never printed)."""

    token_id: str
    private: Ed25519PrivateKey = field(repr=False)


def parse_token(text: str) -> JoinToken | None:
    """The token of a well-formed token text, else None (the text is never echoed)."""
    parsed = parse_secret(_TOKEN, text)
    return JoinToken(*parsed) if parsed is not None else None


def enrolment_message(node_id: str, key_id: str, public_key: str) -> bytes:
    """What a join token signs for a node: which node, with which key."""
    return _ENROLMENT_DOMAIN + f"{node_id}\n{key_id}\n{public_key}".encode()


def enrolment_request(token: JoinToken, node_id: str, key_id: str, public_key: str) -> ev.NodeEnrolmentRequested:
    signature = token.private.sign(enrolment_message(node_id, key_id, public_key))
    return ev.NodeEnrolmentRequested(node_id=node_id, key_id=key_id, public_key=public_key,
                                     token_id=token.token_id, token_signature=b64(signature))


# --- what the store holds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenRecord:
    token_id: str
    public_key: bytes
    description: str
    created_at: datetime
    created_by: str
    expires_at: datetime | None
    revoked_at: datetime | None
    enrolled: int


@dataclass(frozen=True)
class NodeKey:
    key_id: str
    node_id: str
    public_key: bytes
    token_id: str
    enrolled_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None = None


_TOKEN_COLUMNS = "token_id, public_key, description, created_at, created_by, expires_at, revoked_at, enrolled"
_KEY_COLUMNS = "key_id, node_id, public_key, token_id, enrolled_at, revoked_at, revoked_by"


async def create_token(conn: asyncpg.Connection, *, description: str, ttl: timedelta | None, created_by: str,
                       now: datetime) -> tuple[str, TokenRecord]:
    """A new join token: (its text, shown once, and its record). ``ttl`` None: it never expires."""
    if len(description) > 200 or "\x00" in description:
        raise ValueError("a token's description is at most 200 characters, without NUL")
    if ttl is not None and ttl <= timedelta(0):
        raise ValueError("a token's lifetime must be positive")
    private = Ed25519PrivateKey.generate()
    token_id = secrets.token_hex(8)
    row = await conn.fetchrow(
        "INSERT INTO join_tokens (token_id, public_key, description, created_at, created_by, expires_at)"
        f" VALUES ($1, $2, $3, $4, $5, $6) RETURNING {_TOKEN_COLUMNS}",
        token_id, private.public_key().public_bytes_raw(), description, now, created_by,
        now + ttl if ttl is not None else None)
    return f"{TOKEN_PREFIX}{token_id}_{b64(private.private_bytes_raw())}", TokenRecord(**dict(row))


async def list_tokens(conn: asyncpg.Connection) -> list[TokenRecord]:
    rows = await conn.fetch(f"SELECT {_TOKEN_COLUMNS} FROM join_tokens ORDER BY created_at, token_id")
    return [TokenRecord(**dict(r)) for r in rows]


async def revoke_token(conn: asyncpg.Connection, token_id: str, now: datetime) -> bool:
    """Revoke a token (nodes enrolled with it keep their keys); False when no unrevoked token has that id."""
    done = await conn.fetchval("UPDATE join_tokens SET revoked_at = $2 WHERE token_id = $1 AND revoked_at IS NULL"
                               " RETURNING 1", token_id, now)
    return done is not None


async def list_keys(conn: asyncpg.Connection) -> list[NodeKey]:
    rows = await conn.fetch(f"SELECT {_KEY_COLUMNS} FROM node_keys ORDER BY node_id, enrolled_at")
    return [NodeKey(**dict(r)) for r in rows]


async def revoke_node(conn: asyncpg.Connection, node_id: str, by: str, now: datetime) -> list[str]:
    """Revoke the node's live key: its reports are refused from then on (its lease lapses, its jobs are
    requeued) until it enrols again with a join token. The key ids revoked (none: it had no live key)."""
    rows = await conn.fetch("UPDATE node_keys SET revoked_at = $2, revoked_by = $3"
                            " WHERE node_id = $1 AND revoked_at IS NULL RETURNING key_id", node_id, now, by)
    return [r["key_id"] for r in rows]


async def load_keys(conn: asyncpg.Connection, key_ids: Iterable[str]) -> dict[str, NodeKey]:
    ids = sorted({k for k in key_ids if _KEY_ID.match(k)})
    if not ids:
        return {}
    rows = await conn.fetch(f"SELECT {_KEY_COLUMNS} FROM node_keys WHERE key_id = ANY($1::text[])", ids)
    return {r["key_id"]: NodeKey(**dict(r)) for r in rows}


# --- enrolment (pure decision, then the store) ------------------------------------------------------


@dataclass(frozen=True)
class Enrol:
    key: NodeKey
    new: bool  # False: this very key was enrolled already (a resent request)


@dataclass(frozen=True)
class RefuseEnrolment:
    reason: str
    answer: bool  # tell the node (only a holder of a valid token signature is answered: no amplification)


def _verifies(public_key: bytes, signature: str, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(unb64(signature), message)
        return True
    except (InvalidSignature, ValueError, binascii.Error):
        return False


def decide_enrolment(request: ev.NodeEnrolmentRequested, headers: dict[str, str], topic: str, value: bytes,
                     token: TokenRecord | None, live: NodeKey | None, now: datetime) -> Enrol | RefuseEnrolment:
    """Whether to enrol the key a node asks for (pure): ``token`` is the stored token the request names,
    ``live`` the node's live key if it has one."""
    if not is_valid_id(request.node_id):
        return RefuseEnrolment(f"invalid node id {request.node_id[:40]!r}", False)
    if not _KEY_ID.match(request.key_id) or headers.get(SENDER_HEADER) != request.key_id:
        return RefuseEnrolment("the request is not signed by the key it enrols", False)
    try:
        public = unb64(request.public_key)
    except (binascii.Error, ValueError):
        public = b""
    if len(public) != 32:
        return RefuseEnrolment("the public key is no Ed25519 key", False)
    signed_at, signature = headers.get(SIGNED_AT_HEADER), headers.get(SENDER_SIGNATURE_HEADER)
    if not signed_at or not signature or not _verifies(public, signature, signed_bytes(topic, signed_at, value)):
        return RefuseEnrolment("the request is not signed by the key it enrols", False)
    if token is None or not _verifies(token.public_key, request.token_signature,
                                      enrolment_message(request.node_id, request.key_id, request.public_key)):
        return RefuseEnrolment("no join token vouches for this request", False)
    if live is not None and live.key_id == request.key_id and live.public_key == public:
        return Enrol(live, new=False)  # enrolled already (its answer was missed): so it stays, whatever the token
    if not senders.within_window(signed_at, now.timestamp(), senders.ENROLMENT_WINDOW_S):
        return RefuseEnrolment(f"the request was signed at {signed_at[:20]}, not within {senders.ENROLMENT_WINDOW_S:.0f} s "
                               "of now (a replay, or the node's clock is off)", True)
    if token.revoked_at is not None:
        return RefuseEnrolment(f"join token {token.token_id} was revoked", True)
    if token.expires_at is not None and token.expires_at <= now:
        return RefuseEnrolment(f"join token {token.token_id} expired at {token.expires_at.isoformat()}", True)
    if live is not None:
        return RefuseEnrolment(f"node {request.node_id} is enrolled with another key ({live.key_id}); an operator "
                               f"revokes it first: gpusched node-keys revoke {request.node_id}", True)
    return Enrol(NodeKey(request.key_id, request.node_id, public, token.token_id, now, None), new=True)


async def enrol(conn: asyncpg.Connection, request: ev.NodeEnrolmentRequested, headers: dict[str, str], topic: str,
                value: bytes, now: datetime) -> Enrol | RefuseEnrolment:
    """Decide a request from the store and record an enrolment (the caller answers the node)."""
    row = await conn.fetchrow(f"SELECT {_TOKEN_COLUMNS} FROM join_tokens WHERE token_id = $1", request.token_id)
    token = TokenRecord(**dict(row)) if row is not None else None
    live_row = await conn.fetchrow(f"SELECT {_KEY_COLUMNS} FROM node_keys WHERE node_id = $1 AND revoked_at IS NULL",
                                   request.node_id)
    live = NodeKey(**dict(live_row)) if live_row is not None else None
    decision = decide_enrolment(request, headers, topic, value, token, live, now)
    if isinstance(decision, Enrol) and decision.new:
        key = decision.key
        inserted = await conn.fetchval(
            "INSERT INTO node_keys (key_id, node_id, public_key, token_id, enrolled_at) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT DO NOTHING RETURNING 1", key.key_id, key.node_id, key.public_key, key.token_id, now)
        if inserted is None:  # that key id is taken (by a revoked key, or another node's)
            return RefuseEnrolment(f"key id {key.key_id} is taken; make a new key", True)
        await conn.execute("UPDATE join_tokens SET enrolled = enrolled + 1 WHERE token_id = $1", key.token_id)
    return decision


# --- verification of a node's messages ------------------------------------------------------------


class NodeKeys:
    """Node keys as the store holds them, cached ``ttl_s`` per key id (a revocation is seen within it)."""

    def __init__(self, ttl_s: float = DEFAULT_CACHE_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._keys: dict[str, tuple[float, NodeKey, Ed25519PublicKey]] = {}

    async def load(self, conn: asyncpg.Connection, key_ids: Iterable[str]) -> None:
        """Read the keys not cached (or cached too long) in one query."""
        now = self._clock()
        wanted = [k for k in set(key_ids) if k and (k not in self._keys or now - self._keys[k][0] > self._ttl_s)]
        if not wanted:
            return
        found = await load_keys(conn, wanted)
        for key_id in wanted:
            key = found.get(key_id)
            if key is None:
                self._keys.pop(key_id, None)  # never cache a miss: an enrolment may come next
            else:
                self._keys[key_id] = (now, key, Ed25519PublicKey.from_public_bytes(key.public_key))
        if len(self._keys) > 100_000:  # keys of nodes long gone
            for key_id in sorted(self._keys, key=lambda k: self._keys[k][0])[:50_000]:
                del self._keys[key_id]

    def put(self, key: NodeKey) -> None:
        """Know ``key`` without asking the store (benchmarks; a key read by ``load`` is kept the same way)."""
        self._keys[key.key_id] = (self._clock(), key, Ed25519PublicKey.from_public_bytes(key.public_key))

    def forget(self, key_id: str) -> None:
        self._keys.pop(key_id, None)

    def get(self, key_id: str) -> tuple[NodeKey, Ed25519PublicKey] | None:
        entry = self._keys.get(key_id)
        return (entry[1], entry[2]) if entry is not None else None


@dataclass(frozen=True)
class Refused:
    """Why a message is not believed: a short code (what is counted) and a sentence (what is logged)."""

    code: str
    detail: str
    sender: str = "-"  # the node whose key signed it, where the key is known


UNSIGNED, UNKNOWN, REVOKED, BAD_SIGNATURE, OTHER_NODE, STALE, NOT_ALLOWED = (
    "unsigned", "unknown-sender", "revoked", "bad-signature", "other-node", "outside-window", "not-allowed")


def judge(topic: str, value: bytes, headers: dict[str, str], node_id: str | None,
          key: tuple[NodeKey, Ed25519PublicKey] | None, *, now: float, max_age_s: float | None,
          max_skew_s: float) -> Refused | None:
    """Whether a node's message is believed (None) or why not (pure): signed by a live key of the node
    ``node_id`` names, for this topic, at a time within the window."""
    key_id, at, signature = (headers.get(h) for h in (SENDER_HEADER, SIGNED_AT_HEADER, SENDER_SIGNATURE_HEADER))
    if not key_id or not at or not signature:
        return Refused(UNSIGNED, "not signed by a node key")
    if key is None:
        return Refused(UNKNOWN, f"signed by {key_id[:20]!r}, no enrolled node key")
    record, public = key
    if record.revoked_at is not None:
        return Refused(REVOKED, f"signed by node {record.node_id}'s key {record.key_id}, revoked", record.node_id)
    try:
        public.verify(unb64(signature), signed_bytes(topic, at, value))
    except (InvalidSignature, ValueError, binascii.Error):
        return Refused(BAD_SIGNATURE, f"the signature of node {record.node_id}'s key does not hold for it",
                       record.node_id)
    if node_id != record.node_id:
        return Refused(OTHER_NODE, f"node {record.node_id} signed a message about node {str(node_id)[:40]!r}",
                       record.node_id)
    if not senders.within_window(at, now, max_age_s):
        return Refused(STALE, f"signed at {at[:20]}, outside the window of {max_age_s or 0:.0f} s before and "
                              f"{max_skew_s:.0f} s after {now:.0f}", record.node_id)
    return None


def verdict(keys: NodeKeys, message: Incoming, event_type: str, node_id: str | None, *,
            accept_unsigned: bool = False, now: float | None = None) -> Refused | None:
    """Whether a node's message is believed, under its topic's rule (``gpusched_common.senders``), with the
    keys ``keys`` holds now (load its sender's first: ``check``, or ``NodeKeys.load`` for a batch): a type the
    topic does not carry from nodes is refused; the rest as ``judge`` says."""
    rule = senders.rule_for(message.topic, event_type)
    if rule is None or rule.proof != senders.NODE_SIGNATURE:
        return Refused(NOT_ALLOWED, f"nodes do not send {event_type[:40]} on {message.topic}")
    key_id = message.headers.get(SENDER_HEADER)
    if accept_unsigned and not key_id:
        return None
    return judge(message.topic, message.value, message.headers, node_id, keys.get(key_id or ""),
                 now=time.time() if now is None else now, max_age_s=rule.max_age_s, max_skew_s=senders.MAX_SKEW_S)


async def check(conn: asyncpg.Connection, keys: NodeKeys, message: Incoming, event_type: str, node_id: str | None,
                *, accept_unsigned: bool = False, now: float | None = None) -> Refused | None:
    """``verdict``, with the sender's key read from the store first (where not cached)."""
    key_id = message.headers.get(SENDER_HEADER)
    if key_id:
        await keys.load(conn, [key_id])
    return verdict(keys, message, event_type, node_id, accept_unsigned=accept_unsigned, now=now)
