"""Signed messages between gpusched's own processes (issue 14): a service signs every message it puts in
its outbox with its own Ed25519 key (``GPUSCHED_SERVICE_KEY_FILE``), over the topic, the time it signed
and the SHA-256 of the exact value bytes; a receiver that holds the senders' public keys believes a
message only when the signature holds for that topic. First receivers: the node agents, which run
``StartJob`` and the other node commands only when placement or preemption signed them (a plain Kafka
client can no longer run a command on a GPU node).

Headers: ``gpusched-sender`` (the key id), ``gpusched-signed-at`` (Unix seconds, 3 decimals),
``gpusched-sender-signature`` (urlsafe base64, no padding). Keys use the producer key format
(``gsk_<id>_<secret>``, ``gpusched_common.producers``); public keys travel as urlsafe base64 text.
"""

from __future__ import annotations

import binascii
import hashlib
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from gpusched_common.files import write_private
from gpusched_common.producers import ProducerKey, b64, unb64, parse_key, read_key_file

SENDER_HEADER = "gpusched-sender"
SIGNED_AT_HEADER = "gpusched-signed-at"
SENDER_SIGNATURE_HEADER = "gpusched-sender-signature"
_DOMAIN = b"gpusched-message-v1\n"


def signed_bytes(topic: str, signed_at: str, value: bytes) -> bytes:
    """What a signature covers: the topic (a command is not a report), the time, the value's digest."""
    return _DOMAIN + topic.encode() + b"\n" + signed_at.encode() + b"\n" + hashlib.sha256(value).digest()


def new_key() -> tuple[str, ProducerKey]:
    """A fresh key: its text (``gsk_<id>_<secret>``, to keep in a file of mode 0600) and the key."""
    private = Ed25519PrivateKey.generate()
    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    text = f"gsk_{secrets.token_hex(8)}_{b64(raw)}"
    key = parse_key(text)
    assert key is not None
    return text, key


def ensure_key_file(path: Path) -> ProducerKey:
    """The key ``path`` holds; where it holds none, a new one written there (mode 0600)."""
    key = read_key_file(path)
    if key is not None:
        return key
    text, key = new_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, text + "\n")
    return key


def load_key(path: Path) -> ProducerKey:
    """The key a service signs with; ValueError saying what is wrong (the key is never echoed)."""
    key = read_key_file(path)
    if key is None:
        raise ValueError(f"GPUSCHED_SERVICE_KEY_FILE {str(path)!r} holds no key (gsk_<id>_<secret>)")
    return key


@dataclass(frozen=True)
class Signer:
    key: ProducerKey

    def headers(self, topic: str, value: bytes, now: float | None = None) -> dict[str, str]:
        at = f"{time.time() if now is None else now:.3f}"
        return {SENDER_HEADER: self.key.producer_id, SIGNED_AT_HEADER: at,
                SENDER_SIGNATURE_HEADER: b64(self.key.private.sign(signed_bytes(topic, at, value)))}


_signer: Signer | None = None


def configure(signer: Signer | None) -> None:
    """The signer of this process's outgoing messages (a service's key; None: it signs nothing)."""
    global _signer
    _signer = signer


def headers_for(topic: str, value: bytes) -> dict[str, str]:
    """The signature headers of a message this process sends (none where it has no key)."""
    return _signer.headers(topic, value) if _signer is not None else {}


class TrustedKeys:
    """The public keys of the senders a receiver believes, by key id, each with the sender's name where it
    is given (``placement``, ``preemption``): a named sender is believed only for what the senders table
    lets it send (``gpusched_common.senders``)."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], names: Mapping[str, str] | None = None) -> None:
        self._keys = dict(keys)
        self._names = dict(names or {})

    @classmethod
    def parse(cls, entries: Iterable[str]) -> TrustedKeys:
        """``[<sender>=]<key id>:<public key>`` entries (urlsafe base64); ValueError naming the bad one."""
        keys, names = {}, {}
        for entry in (e.strip() for e in entries if e.strip()):
            name, named, rest = entry.partition("=")
            if not named:
                name, rest = "", entry
            key_id, sep, text = rest.partition(":")
            try:
                raw = unb64(text)
                if not sep or len(raw) != 32 or (named and not name.isidentifier()):
                    raise ValueError
                keys[key_id] = Ed25519PublicKey.from_public_bytes(raw)
            except (ValueError, binascii.Error):
                raise ValueError(f"trusted key {entry[:24]!r}... is not [<sender>=]<key id>:<Ed25519 public key>") \
                    from None
            if named:
                names[key_id] = name
        return cls(keys, names)

    @classmethod
    def read(cls, path: Path) -> TrustedKeys:
        try:
            return cls.parse(path.read_text().replace(",", "\n").splitlines())
        except OSError as exc:
            raise ValueError(f"trusted keys file {str(path)!r} cannot be read: {exc}") from None

    def merged(self, other: TrustedKeys) -> TrustedKeys:
        """Both sets of keys (``other``'s entry wins for a key id in both)."""
        return TrustedKeys({**self._keys, **other._keys}, {**self._names, **other._names})

    def __len__(self) -> int:
        return len(self._keys)

    def sender(self, headers: Mapping[str, str]) -> str | None:
        """The name of the sender whose key id the headers give (None: unnamed or unknown)."""
        return self._names.get(headers.get(SENDER_HEADER, ""))

    def check(self, topic: str, value: bytes, headers: Mapping[str, str]) -> str | None:
        """Why the message is not believed (None: a trusted sender signed it for this topic)."""
        key_id, at, signature = (headers.get(h) for h in (SENDER_HEADER, SIGNED_AT_HEADER, SENDER_SIGNATURE_HEADER))
        if not key_id or not at or not signature:
            return "unsigned: no gpusched-sender signature"
        key = self._keys.get(key_id)
        if key is None:
            return f"signed by an unknown sender {key_id[:20]!r}"
        try:
            key.verify(unb64(signature), signed_bytes(topic, at, value))
        except (InvalidSignature, ValueError, binascii.Error):
            return f"the signature of sender {key_id[:20]!r} does not hold for this message on {topic}"
        return None


def trusted_entry(key: ProducerKey, sender: str | None = None) -> str:
    """How a receiver is told to trust ``key``: ``[<sender>=]<key id>:<public key>``."""
    return f"{sender + '=' if sender else ''}{key.producer_id}:{key.public_key_text()}"
