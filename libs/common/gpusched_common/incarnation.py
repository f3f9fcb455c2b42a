"""Which broker a client talks to: its cluster id, as the broker's own metadata answers it (issue 15).

A Kafka cluster keeps one cluster id for as long as it keeps its data (KRaft writes it into every storage
directory at format time); a cluster formatted again, or a memory-only broker started again, has a new
one. So a cluster id that changed under a running consumer means its positions belong to a log that no
longer exists: it must read the new log from its start (duplicates are what the inbox is for), however
far that log has grown by the time it notices. Tansu is started with a fresh cluster id each time
(`gpusched_common.infra.brokers`) for that reason: it keeps nothing across a restart.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiokafka.protocol.metadata import MetadataRequest

RESET_WINDOW_S = 60.0  # after a new incarnation is seen: partitions assigned meanwhile are read from the start


async def cluster_id(client, timeout_s: float = 1.0) -> str | None:  # noqa: ANN001 - an AIOKafkaClient
    """The cluster id the broker reports (metadata v2 and later); None when it cannot be asked now."""
    node = client.get_random_node()
    if node is None:
        return None
    async with asyncio.timeout(timeout_s):  # not wait_for: see relay._pump
        response = await client.send(node, MetadataRequest(topics=[]))
    found = getattr(response, "cluster_id", None)
    return found if isinstance(found, str) and found else None


@dataclass
class Incarnation:
    """The cluster id seen last, and when a different one was first seen."""

    known: str | None = None
    changed_at: float | None = None

    def note(self, found: str | None, now: float) -> bool:
        """Take the id just read (None: not read); True when it differs from the one known before."""
        if found is None:
            return False
        changed = self.known is not None and found != self.known
        self.known = found
        if changed:
            self.changed_at = now
        return changed

    def resetting(self, now: float) -> bool:
        """Whether partitions are still to be read from their start after the last change."""
        return self.changed_at is not None and now - self.changed_at <= RESET_WINDOW_S
