"""The gateway's door onto the bus: it publishes submissions on ``gpusched.jobs.submitted`` as a credentialed
producer (``gpusched_common.producers``), each message signed with its own key, so admission knows the
gateway sent it and believes the principal it attests. A response is given only once the broker has
acknowledged the message (``acks=all``): an accepted job is never lost."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from gpusched_common import events as ev
from gpusched_common.kafka_client import client_options
from gpusched_common.producers import ProducerKey
from gpusched_common.settings import Settings
from gpusched_common.topics import JOBS_SUBMITTED

log = logging.getLogger(__name__)


class NotPublished(RuntimeError):
    """The broker did not take the submission (unreachable, or refused it): the caller may retry."""


class SubmissionPublisher:
    """Started lazily and restarted after a failure, so the gateway serves reads while the broker is away."""

    def __init__(self, settings: Settings, key: ProducerKey | None, *, timeout_s: float) -> None:
        self._settings, self.key, self._timeout_s = settings, key, timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

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
        try:
            async with asyncio.timeout(self._timeout_s):
                sent = [await producer.send(topic, value, key=job_id.encode(),
                                            headers=self._headers(value, traceparent, event_type))
                        for job_id, value, traceparent in records]
                await asyncio.gather(*sent)
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("publishing %d submission(s) failed: %s", len(records), type(exc).__name__)
            await self._reset()
            raise NotPublished(f"the broker did not acknowledge the submission ({type(exc).__name__})") from None

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
