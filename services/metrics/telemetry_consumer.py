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

import asyncpg

from gpusched_common import node_keys
from gpusched_common.db import DATABASE_AWAY
from gpusched_common.kafka_client import client_options
from gpusched_common.messaging import Incoming, PoisonMessage, to_incoming
from gpusched_common.senders import RefusalCounts
from gpusched_common.signing import SENDER_HEADER
from gpusched_common.settings import Settings
from gpusched_common.topics import GROUP_METRICS, NODES_TELEMETRY

from services.metrics.store import SERVICE
from services.metrics.tracker import TelemetryTracker, parse_telemetry

log = logging.getLogger(__name__)


class TelemetryConsumer:
    """``pool``: where the nodes' keys are read (each telemetry message is believed only when the node it
    names signed it, ``gpusched_common.node_keys``; the keys of a batch's senders are read in one query and
    cached). Without a pool only ``keys`` already loaded are known (benchmarks)."""

    def __init__(self, settings: Settings, tracker: TelemetryTracker, *, group_id: str | None = GROUP_METRICS,
                 topic: str = NODES_TELEMETRY.name, pool: asyncpg.Pool | None = None,
                 keys: node_keys.NodeKeys | None = None) -> None:
        self._settings = settings
        self._tracker = tracker
        self._group_id = group_id
        self._topic = topic
        self._pool = pool
        self._keys = keys if keys is not None else node_keys.NodeKeys()
        self.refused = RefusalCounts(SERVICE)
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

    def ingest_batch(self, records: list[Incoming]) -> int:
        """Fold a batch into the tracker (its senders' keys loaded): what no enrolled node signed is counted
        and dropped, as is what cannot be read."""
        samples, now = 0, time.time()
        for record in records:
            try:
                payload = parse_telemetry(record.value)
                if payload is None:
                    continue
                refusal = node_keys.verdict(self._keys, record, payload.TYPE, payload.node_id, now=now,
                                            accept_unsigned=self._settings.accept_unsigned_node_reports)
                if refusal is not None:
                    self.refused.note(record.topic, refusal.code, refusal.sender, refusal.detail)
                    continue
                self._tracker.record(payload)
                samples += len(payload.samples)
            except PoisonMessage as exc:
                self.rejected += 1
                now_m = time.monotonic()
                if now_m - self._last_warning > 10.0:
                    self._last_warning = now_m
                    log.warning("skipping unreadable telemetry (%d so far): %s", self.rejected, exc)
        return samples

    async def _load_keys(self, records: list[Incoming]) -> None:
        if self._pool is None:
            return
        wanted = {r.headers.get(SENDER_HEADER, "") for r in records} - {""}
        if wanted:
            async with self._pool.acquire() as conn:
                await self._keys.load(conn, wanted)

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
                        incoming = [to_incoming(r) for r in records if r.value is not None]
                        await self._load_keys(incoming)
                        self.ingest_batch(incoming)
                    await asyncio.sleep(0)
                return
            except (ConnectionError, KafkaError, *DATABASE_AWAY) as exc:
                # the broker, or the database it reads node keys from (a PostgreSQL restart: "the database
                # system is starting up"), is away: the service waits for it instead of dying
                log.warning("telemetry consumer lost the broker or the database (%s); reconnecting in %.1fs", exc,
                            delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                await consumer.stop()
