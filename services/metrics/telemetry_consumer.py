"""The telemetry consumer: a batch loop on aiokafka for the high-volume telemetry topic.

Telemetry is not event-sourced and a lost sample is replaced by the next one, so this path skips the
per-message transaction, inbox and offset commit of the command/event consumers: it fetches batches,
folds them into the tracker and commits offsets periodically. An unreadable message is counted and
skipped (logged once per interval), never retried.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from gpusched_common.kafka_client import client_options
from gpusched_common.messaging import PoisonMessage
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_METRICS, NODES_TELEMETRY

from services.metrics.tracker import TelemetryTracker

log = logging.getLogger(__name__)


class TelemetryConsumer:
    def __init__(self, settings: Settings, tracker: TelemetryTracker, *, group_id: str | None = GROUP_METRICS,
                 topic: str = NODES_TELEMETRY.name) -> None:
        self._settings = settings
        self._tracker = tracker
        self._group_id = group_id
        self._topic = topic
        self.rejected = 0
        self._last_warning = 0.0

    def _consumer(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            self._topic, **client_options(self._settings), group_id=self._group_id,
            client_id="metrics-telemetry", auto_offset_reset="latest" if self._group_id else "earliest",
            enable_auto_commit=self._group_id is not None, auto_commit_interval_ms=1000,
            session_timeout_ms=self._settings.kafka_session_timeout_ms,
            heartbeat_interval_ms=max(100, self._settings.kafka_session_timeout_ms // 4),
            max_partition_fetch_bytes=self._settings.kafka_max_request_bytes)

    def ingest_batch(self, values: list[bytes]) -> int:
        samples = 0
        for value in values:
            try:
                samples += self._tracker.ingest(value)
            except PoisonMessage as exc:
                self.rejected += 1
                now = time.monotonic()
                if now - self._last_warning > 10.0:
                    self._last_warning = now
                    log.warning("skipping unreadable telemetry (%d so far): %s", self.rejected, exc)
        return samples

    async def run(self, stop_after_messages: int | None = None) -> None:
        """Consume until cancelled (or, for benchmarks, until `stop_after_messages` were read)."""
        delay = 0.2
        while True:
            consumer = self._consumer()
            try:
                await consumer.start()
                delay = 0.2
                seen = 0
                while stop_after_messages is None or seen < stop_after_messages:
                    batches = await consumer.getmany(timeout_ms=500, max_records=5000)
                    for records in batches.values():
                        seen += len(records)
                        self.ingest_batch([r.value for r in records if r.value is not None])
                    await asyncio.sleep(0)
                return
            except (OSError, ConnectionError, KafkaError) as exc:
                log.warning("telemetry consumer lost the broker (%s); reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                await consumer.stop()
