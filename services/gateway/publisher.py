"""The gateway's door onto the bus: it publishes submissions on ``gpusched.jobs.submitted`` as a credentialed
producer (``gpusched_common.producers``), each message signed with its own key, so admission knows the
gateway sent it and believes the principal it attests. A response is given only once the broker has
acknowledged the message (``acks=all``): an accepted job is never lost.

The broker's acknowledgement is the gateway's proof, so a broker that loses acknowledged data (Tansu
restarted; a Kafka log wiped) would lose what admission had not read yet: the gateway keeps what it
published for ``republish_s`` (at most ``REPUBLISH_MAX`` records) and, when an acknowledgement comes at an
offset below one before on that partition (``gpusched_common.ack_offsets``), publishes them again;
admission takes a submission it has as a duplicate. (Kept in memory: a gateway that dies with the broker's
data loses that window; production runs Apache Kafka with replication, which keeps what it acknowledged.)
What the store has recorded needs no keeping (a republish leaves it out): ``forget_recorded`` drops those
every few seconds, so a gateway keeps what admission has not read yet, not every job of the window (with
tens of thousands of jobs waiting that was about 1.5 KiB each). Each kept record is one compressed blob of
its value and headers beside its key (``_pack``): a submission's value and four headers as Python objects
took about 1.7 KiB, as one blob about 0.5 KiB, for some 10 us of CPU when it is published."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from gpusched_common import events as ev
from gpusched_common.ack_offsets import AckOffsets
from gpusched_common.kafka_client import client_options
from gpusched_common.producers import ProducerKey
from gpusched_common.settings import Settings
from gpusched_common.topics import JOBS_SUBMITTED

log = logging.getLogger(__name__)
REPUBLISH_MAX = 100_000  # records kept to publish again after a broker lost its data
FORGET_CHUNK = 5_000  # kept submissions ``forget_recorded`` asks the store about at once
FORGET_INTERVAL_S = 2.0  # how often a gateway forgets the kept submissions the store has recorded


def _pack(value: bytes, headers: list[tuple[str, bytes]]) -> bytes:
    """A record's value and headers as one compressed blob (each part length-prefixed): kept in memory for
    the republish window, so small matters more than fast (level 1 all the same)."""
    parts = [value, *(part for name, header in headers for part in (name.encode(), header))]
    return zlib.compress(b"".join(len(part).to_bytes(4, "big") + part for part in parts), 1)


def _unpack(blob: bytes) -> tuple[bytes, list[tuple[str, bytes]]]:
    """``_pack``'s value and headers back."""
    raw, parts, at = zlib.decompress(blob), [], 0
    while at < len(raw):
        size = int.from_bytes(raw[at:at + 4], "big")
        parts.append(raw[at + 4:at + 4 + size])
        at += 4 + size
    return parts[0], [(name.decode(), header) for name, header in zip(parts[1::2], parts[2::2], strict=True)]


class NotPublished(RuntimeError):
    """The broker did not take the submission (unreachable, or refused it): the caller may retry."""


class SubmissionPublisher:
    """Started lazily and restarted after a failure, so the gateway serves reads while the broker is away."""

    def __init__(self, settings: Settings, key: ProducerKey | None, *, timeout_s: float,
                 republish_s: float = 900.0) -> None:
        self._settings, self.key, self._timeout_s = settings, key, timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._republish_s = republish_s
        self._offsets = AckOffsets()
        # (when, topic, key, ``_pack``ed value and headers) of each record published in the window
        self._recent: deque[tuple[float, str, bytes, bytes]] = deque(maxlen=REPUBLISH_MAX)
        self.losses = 0  # how often the broker was found to have lost data
        # the job ids among these the store has recorded (set by the gateway once its pool is open): their
        # submissions are not published again, the store has them and the services' passes do the rest
        self.recorded: Callable[[list[str]], Awaitable[set[str]]] | None = None

    async def _started(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    **client_options(self._settings), client_id="gpusched-gateway", acks="all",
                    enable_idempotence=self._settings.kafka_idempotence, linger_ms=2,
                    max_request_size=self._settings.kafka_max_request_bytes, request_timeout_ms=int(self._timeout_s * 1000))
                try:
                    async with asyncio.timeout(self._timeout_s):
                        await producer.start()
                except (KafkaError, OSError, TimeoutError) as exc:
                    await producer.stop()
                    raise NotPublished(f"the broker is not reachable ({type(exc).__name__})") from None
                self._producer = producer
            return self._producer

    async def publish(self, records: Sequence[tuple[str, bytes, str | None]], *, topic: str = JOBS_SUBMITTED.name,
                      event_type: str = ev.JobSubmitted.TYPE) -> None:
        """Publish ``(job_id, envelope bytes, traceparent)`` records of ``event_type`` on ``topic``, signed, and
        wait for every ack."""
        if self.key is None:
            raise NotPublished("this gateway has no producer credential (GPUSCHED_GATEWAY_PRODUCER_KEY_FILE)")
        producer = await self._started()
        outgoing = [(topic, job_id.encode(), value, self._headers(value, traceparent, event_type))
                    for job_id, value, traceparent in records]
        try:
            async with asyncio.timeout(self._timeout_s):
                acks = await self._send(producer, outgoing)
                lost = self._offsets.note(acks)
                if lost:
                    await self._republish(producer, lost)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("publishing %d submission(s) failed: %s", len(records), type(exc).__name__)
            await self._reset()
            raise NotPublished(f"the broker did not acknowledge the submission ({type(exc).__name__})") from None
        now = time.monotonic()
        self._recent.extend((now, topic, key, _pack(value, headers)) for topic, key, value, headers in outgoing)
        while self._recent and self._recent[0][0] < now - self._republish_s:
            self._recent.popleft()

    def kept(self) -> int:
        """How many records are kept to publish again."""
        return len(self._recent)

    async def forget_recorded(self) -> int:
        """Drop the kept submissions the store has recorded, of the oldest ``FORGET_CHUNK`` kept (the rest wait
        for a later call); how many were dropped. Raises when the store cannot be read."""
        if self.recorded is None:
            return 0
        ids = [key.decode() for _, topic, key, *_ in itertools.islice(self._recent, FORGET_CHUNK)
               if topic == JOBS_SUBMITTED.name]
        known = await self.recorded(ids) if ids else set()
        if not known:
            return 0
        before = len(self._recent)
        # no await from here on: a publish that ends meanwhile appends to the new deque, never to a dropped one
        self._recent = deque((r for r in self._recent if not (r[1] == JOBS_SUBMITTED.name and r[2].decode() in known)),
                             maxlen=REPUBLISH_MAX)
        return before - len(self._recent)

    async def forget_recorded_forever(self, interval_s: float = FORGET_INTERVAL_S) -> None:
        """``forget_recorded`` every ``interval_s`` (at once again after a full chunk); a store that cannot be
        read keeps everything until it can (the window still ends after ``republish_s``)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                while await self.forget_recorded() >= FORGET_CHUNK // 2:
                    pass
            except Exception as exc:  # noqa: BLE001 - the store away: keep the records, ask again later
                log.info("could not read which kept submissions the store has recorded (%s); keeping them",
                         type(exc).__name__)

    @staticmethod
    async def _send(producer: AIOKafkaProducer, outgoing: list) -> list:
        sent = [await producer.send(topic, value, key=key, headers=headers) for topic, key, value, headers in outgoing]
        return list(await asyncio.gather(*sent))

    async def _republish(self, producer: AIOKafkaProducer, lost: list[str]) -> None:
        """The broker lost its data: what was published before this batch goes again (signed as it was)."""
        again = [(topic, key, *_unpack(blob)) for _, topic, key, blob in self._recent]
        self.losses += 1
        known: set[str] = set()
        if self.recorded is not None:
            try:
                known = await self.recorded([key.decode() for topic, key, *_ in again if topic == JOBS_SUBMITTED.name])
            except Exception as exc:  # noqa: BLE001 - the store is away too: publish them all, consumers dedupe
                log.warning("could not read which submissions the store has (%s): publishing all again", exc)
        again = [r for r in again if not (r[0] == JOBS_SUBMITTED.name and r[1].decode() in known)]
        log.error("the broker lost data (%s); publishing again the %d submission(s) and request(s) of the last %.0f s "
                  "the store has not recorded (%d it has are left out)", "; ".join(lost[:3]), len(again),
                  self._republish_s, len(known))
        self._offsets.note(await self._send(producer, again))

    def _headers(self, value: bytes, traceparent: str | None, event_type: str) -> list[tuple[str, bytes]]:
        assert self.key is not None
        headers = {"event-type": event_type, **self.key.headers(value)}
        if traceparent:
            headers["traceparent"] = traceparent
        return [(k, v.encode()) for k, v in headers.items()]

    async def ready(self) -> str | None:
        """None when the broker answers (its metadata for the submissions topic), else why not."""
        try:
            producer = await self._started()
            async with asyncio.timeout(2.0):
                partitions = await producer.partitions_for(JOBS_SUBMITTED.name)
        except (NotPublished, KafkaError, OSError, TimeoutError) as exc:
            await self._reset()
            return str(exc) if isinstance(exc, NotPublished) else f"the broker is not reachable ({type(exc).__name__})"
        return None if partitions else f"the topic {JOBS_SUBMITTED.name} does not exist"

    async def _reset(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.stop()
            except (KafkaError, OSError):
                pass

    async def stop(self) -> None:
        await self._reset()
