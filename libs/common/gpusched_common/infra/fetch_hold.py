"""One client connection through the Tansu front (`infra/tansu_front.py`), with fetches held the way Apache
Kafka holds them.

Tansu answers a fetch that found no record only when the fetch's ``max_wait_ms`` runs out, even if a record
arrives meanwhile (measured: a 202 ms round trip at 500 ms); so consumers had to poll it every 50 ms, and
with 1,000 simulated nodes that polling took about a quarter of the machine while nothing happened. Kafka
answers a waiting fetch as soon as a record arrives. The front now does that in Tansu's place: it passes a
fetch on with ``max_wait_ms`` 0, and holds an empty answer until a produce to one of the fetch's partitions
has been acknowledged through the front (then it fetches again) or until the client's own wait runs out
(then it returns the empty answer). Every client reaches Tansu through the front, so every produce passes.

Requests of one connection are answered in order, and a broker reads a connection's next request only
once it answered the one before (Kafka mutes the connection meanwhile): while a fetch is held, this link
reads nothing more from its client; every other request is passed on at once, pipelined as it came.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import time

from gpusched_common.infra import kafka_frames as kf

_SIZE = struct.Struct(">i")
MAX_FRAME = 256 * 1024 * 1024  # larger than any request or answer the stack makes; beyond it, a broken stream

# the wait the front's fetches ask of Tansu: it answers a fetch with max_wait_ms 0 at once and with nothing,
# records or not; with 1 ms it reads what it has
BROKER_WAIT_MS = 1

Key = tuple[str, int]  # (topic, partition)


class Produced:
    """Which partitions have been written to through the front, and who waits for one of them."""

    def __init__(self) -> None:
        self.seq = 0
        self._last: dict[Key, int] = {}  # partition -> seq of its last acknowledged produce
        self._waiters: dict[Key, set[asyncio.Future[None]]] = {}

    def wrote(self, keys: tuple[Key, ...]) -> None:
        self.seq += 1
        for key in keys:
            self._last[key] = self.seq
            for waiter in self._waiters.pop(key, ()):
                if not waiter.done():
                    waiter.set_result(None)

    def since(self, keys: tuple[Key, ...], seq: int) -> bool:
        """Whether any of these partitions was written to after `seq`."""
        last = self._last
        return any(last.get(key, 0) > seq for key in keys)

    async def wait(self, keys: tuple[Key, ...], seq: int, timeout_s: float) -> None:
        """Until one of these partitions is written to after `seq`, or `timeout_s` passed."""
        if self.since(keys, seq) or timeout_s <= 0:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters.setdefault(key, set()).add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            for key in keys:
                held = self._waiters.get(key)
                if held is not None:
                    held.discard(waiter)
                    if not held:
                        del self._waiters[key]


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """One size-prefixed frame (without its size), or None at the end of the stream."""
    try:
        size = _SIZE.unpack(await reader.readexactly(4))[0]
        if not 0 <= size <= MAX_FRAME:
            raise ConnectionError(f"a frame of {size} bytes")
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None


class Link:
    """Client <-> Tansu for one connection: two loops, one each way, and the answers still owed, in order."""

    def __init__(self, produced: Produced, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 back_reader: asyncio.StreamReader, back_writer: asyncio.StreamWriter) -> None:
        self.produced = produced
        self.reader, self.writer = reader, writer
        self.back_reader, self.back_writer = back_reader, back_writer
        # one entry per request passed on: the partitions of an acknowledged produce to announce (a tuple),
        # or a future for the answer to a fetch this link holds
        self.owed: collections.deque[tuple[Key, ...] | asyncio.Future[bytes]] = collections.deque()
        # every partition this client fetched on this connection: a record for any of them answers a held fetch
        self.interest: set[Key] = set()
        self._interest: tuple[Key, ...] = ()

    async def run(self) -> None:
        up = asyncio.ensure_future(self._up())
        down = asyncio.ensure_future(self._down())
        try:
            await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            for entry in self.owed:
                if isinstance(entry, asyncio.Future) and not entry.done():
                    entry.cancel()

    async def _up(self) -> None:
        """Client -> Tansu."""
        try:
            while (frame := await read_frame(self.reader)) is not None:
                try:
                    head = kf.header(frame)
                    fetch = kf.fetch_request(frame, head)
                    produce = kf.produce_request(frame, head) if fetch is None else None
                except kf.Malformed:
                    head = fetch = produce = None
                if fetch is not None and fetch.max_wait_ms > 0 and fetch.min_bytes > 0 and fetch.partitions:
                    await self._fetch(frame, fetch)
                    continue
                if produce is not None and produce[0] == 0:  # acks 0: no answer comes; announce once sent
                    self._send(frame)
                    await self.back_writer.drain()
                    self.produced.wrote(produce[1])
                    continue
                self.owed.append(produce[1] if produce is not None else ())
                self._send(frame)
                await self.back_writer.drain()
        except (OSError, ConnectionError):
            pass

    def _send(self, frame: bytes) -> None:
        self.back_writer.write(_SIZE.pack(len(frame)) + frame)

    async def _fetch(self, frame: bytes, fetch: kf.Fetch) -> None:
        deadline = time.monotonic() + fetch.max_wait_ms / 1000
        at_once = kf.with_wait(frame, fetch, min(fetch.max_wait_ms, BROKER_WAIT_MS))
        if not self.interest.issuperset(fetch.partitions):
            self.interest.update(fetch.partitions)
            self._interest = tuple(self.interest)
        while True:
            seq = self.produced.seq
            answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            self.owed.append(answer)
            self._send(at_once)
            await self.back_writer.drain()
            body = await answer
            left = deadline - time.monotonic()
            if left <= 0 or not kf.fetch_answer_empty(body, fetch.version):
                break
            await self.produced.wait(self._interest, seq, left)
            if not self.produced.since(fetch.partitions, seq):
                # the wait ran out, or a record came for a partition this client fetched before but left out
                # of this fetch (aiokafka leaves out those whose records it still holds): answer now, and the
                # client's next fetch asks for it again
                break
        self.writer.write(_SIZE.pack(len(body)) + body)
        await self.writer.drain()

    async def _down(self) -> None:
        """Tansu -> client, in the order the requests went."""
        try:
            while (frame := await read_frame(self.back_reader)) is not None:
                if not self.owed:
                    raise ConnectionError("an answer to no request")
                entry = self.owed.popleft()
                if isinstance(entry, asyncio.Future):
                    if not entry.done():
                        entry.set_result(frame)
                    continue
                self.writer.write(_SIZE.pack(len(frame)) + frame)
                await self.writer.drain()
                if entry:
                    self.produced.wrote(entry)
        except (OSError, ConnectionError):
            pass
