"""The outbox relay: publishes committed outbox rows in id order, then marks them published.

One relay per producer is active at a time (a PostgreSQL advisory lock); a standby takes over when the
active one dies. A crash between publishing and marking republishes those rows on restart: consumers
dedupe by event id (the inbox), so at-least-once publishing yields effectively-once effects.
"""

from __future__ import annotations

import asyncio
import logging
import zlib

import asyncpg
from faststream.kafka import KafkaBroker

log = logging.getLogger(__name__)

_BATCH = 500


class OutboxRelay:
    def __init__(self, pool: asyncpg.Pool, broker: KafkaBroker, producer: str, *, poll_interval_s: float) -> None:
        self._pool = pool
        self._broker = broker
        self._producer = producer
        self._poll_interval_s = poll_interval_s
        self._wake = asyncio.Event()
        self._lock_id = zlib.crc32(f"outbox:{producer}".encode())

    def wake(self) -> None:
        """Called after a transaction that wrote outbox rows commits, to publish without polling delay."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                async with self._pool.acquire() as lock_conn:
                    if not await lock_conn.fetchval("SELECT pg_try_advisory_lock($1)", self._lock_id):
                        await asyncio.sleep(1.0)  # another replica relays for this producer
                        continue
                    try:
                        await self._pump()
                    finally:
                        await lock_conn.execute("SELECT pg_advisory_unlock($1)", self._lock_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the relay must outlive broker and database outages
                log.exception("outbox relay for %s failed; restarting", self._producer)
                await asyncio.sleep(1.0)

    async def _pump(self) -> None:
        while True:
            published = await self.publish_pending()
            if published < _BATCH:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self._poll_interval_s)
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()

    async def publish_pending(self) -> int:
        """Publish one batch of unpublished rows in order; returns how many."""
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT id, topic, key, headers, value FROM outbox"
                " WHERE producer = $1 AND published_at IS NULL ORDER BY id LIMIT $2",
                self._producer, _BATCH,
            )
            if not rows:
                return 0
            pending = [
                await self._broker.publish(bytes(r["value"]), r["topic"], key=r["key"].encode(),
                                           headers=r["headers"], no_confirm=True)
                for r in rows
            ]
            await asyncio.gather(*pending)  # every row acknowledged by the broker (acks=all) before marking
            await conn.execute("UPDATE outbox SET published_at = clock_timestamp() WHERE id = ANY($1::bigint[])",
                               [r["id"] for r in rows])
            return len(rows)
