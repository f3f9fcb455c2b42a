"""The few facts the Tansu front reads from the Kafka requests and responses it passes on
(`infra/tansu_front.py`): which partitions a fetch reads and how long it may wait, which partitions a produce
wrote, and whether a fetch's answer holds any record. Pure functions over bytes, no I/O.

Every request is a 4-byte size, then a header (api key, api version, correlation id, client id) and a body;
the versions read here are the non-flexible ones aiokafka sends (Fetch v0-v11, Produce v0-v8); anything
else (`None` from a parser) is passed on untouched. A frame here is the bytes after the size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PRODUCE, FETCH = 0, 1
MAX_FETCH_VERSION, MAX_PRODUCE_VERSION = 11, 8

_I16, _I32 = struct.Struct(">h"), struct.Struct(">i")
_HEADER = struct.Struct(">hhih")  # api key, api version, correlation id, client id's length


class Malformed(ValueError):
    """A frame shorter than its own fields say."""


@dataclass(frozen=True, slots=True)
class Header:
    api_key: int
    api_version: int
    correlation_id: int
    body_at: int  # where the body starts in the frame


@dataclass(frozen=True, slots=True)
class Fetch:
    version: int
    max_wait_ms: int
    min_bytes: int
    wait_at: int  # where max_wait_ms sits in the frame
    partitions: tuple[tuple[str, int], ...]


def header(frame: bytes) -> Header:
    if len(frame) < _HEADER.size:
        raise Malformed("request header cut short")
    api_key, version, correlation_id, client_len = _HEADER.unpack_from(frame, 0)
    return Header(api_key, version, correlation_id, _HEADER.size + max(client_len, 0))


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes, at: int) -> None:
        self.data, self.at = data, at

    def _take(self, n: int) -> int:
        at = self.at
        if n < 0 or at + n > len(self.data):
            raise Malformed(f"{n} byte(s) wanted at {at} of {len(self.data)}")
        self.at = at + n
        return at

    def i16(self) -> int:
        return _I16.unpack_from(self.data, self._take(2))[0]

    def i32(self) -> int:
        return _I32.unpack_from(self.data, self._take(4))[0]

    def skip(self, n: int) -> None:
        self._take(n)

    def string(self) -> str:
        n = self.i16()
        if n < 0:
            return ""
        at = self._take(n)
        return self.data[at:at + n].decode("utf-8", "replace")

    def skip_bytes(self) -> int:
        """Skip a length-prefixed byte string (null: -1); return its length."""
        n = self.i32()
        if n > 0:
            self._take(n)
        return n

    def count(self) -> int:
        n = self.i32()
        return max(n, 0)  # a null array reads as empty


def fetch_request(frame: bytes, head: Header) -> Fetch | None:
    """The fetch a request frame asks for, or None where it is not a fetch this module reads."""
    version = head.api_version
    if head.api_key != FETCH or not 0 <= version <= MAX_FETCH_VERSION:
        return None
    r = _Reader(frame, head.body_at)
    r.skip(4)  # replica_id
    wait_at = r.at
    max_wait_ms, min_bytes = r.i32(), r.i32()
    r.skip((4 if version >= 3 else 0) + (1 if version >= 4 else 0) + (8 if version >= 7 else 0))
    entry = 28 if version >= 9 else 24 if version >= 5 else 16  # partition (+ epoch), offset(s), max_bytes
    partitions = []
    for _ in range(r.count()):
        topic = r.string()
        for _ in range(r.count()):
            partition = r.i32()
            r.skip(entry - 4)
            partitions.append((topic, partition))
    return Fetch(version, max_wait_ms, min_bytes, wait_at, tuple(partitions))


def with_wait(frame: bytes, fetch: Fetch, wait_ms: int) -> bytes:
    """The same fetch with another max_wait_ms."""
    return frame[:fetch.wait_at] + _I32.pack(wait_ms) + frame[fetch.wait_at + 4:]


def produce_request(frame: bytes, head: Header) -> tuple[int, tuple[tuple[str, int], ...]] | None:
    """(acks, the partitions written) of a produce request frame, or None where it is not one read here."""
    version = head.api_version
    if head.api_key != PRODUCE or not 0 <= version <= MAX_PRODUCE_VERSION:
        return None
    r = _Reader(frame, head.body_at)
    if version >= 3:
        r.string()  # transactional_id
    acks = r.i16()
    r.skip(4)  # timeout
    partitions = []
    for _ in range(r.count()):
        topic = r.string()
        for _ in range(r.count()):
            partitions.append((topic, r.i32()))
            r.skip_bytes()
    return acks, tuple(partitions)


def fetch_answer_empty(frame: bytes, version: int) -> bool:
    """Whether a fetch response frame (after its size) carries no record and no error: an answer worth
    holding back until a record may be there. Anything unexpected reads as not empty (passed on)."""
    try:
        r = _Reader(frame, 4)  # correlation id
        if version >= 1:
            r.skip(4)  # throttle_time_ms
        if version >= 7:
            if r.i16() != 0:
                return False
            r.skip(4)  # session_id
        for _ in range(r.count()):
            r.string()
            for _ in range(r.count()):
                r.skip(4)  # partition
                if r.i16() != 0:
                    return False
                r.skip(8 + (8 if version >= 4 else 0) + (8 if version >= 5 else 0))
                if version >= 4:
                    r.skip(16 * r.count())  # aborted transactions
                if version >= 11:
                    r.skip(4)  # preferred_read_replica
                if r.skip_bytes() > 0:
                    return False
        return r.at == len(frame)
    except Malformed:
        return False
