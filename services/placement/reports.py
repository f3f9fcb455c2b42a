"""Node reports read a batch at a time: every sender's key in one query, every heartbeat in one update."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common import node_keys
from gpusched_common.batching import Batch
from gpusched_common.signing import SENDER_HEADER
from gpusched_common.topics import NODES_REPORTS

from services.placement import store


async def load_senders(conn: asyncpg.Connection, keys: node_keys.NodeKeys, batch: Batch) -> None:
    """Read the keys of every node report's sender in the batch in one query, once per batch (``check`` then
    reads only a key enrolled within the batch itself)."""
    if "node-keys" in batch.memo:
        return
    batch.memo["node-keys"] = True
    await keys.load(conn, [m.headers.get(SENDER_HEADER, "") for m in batch.messages if m.topic == NODES_REPORTS.name])


def defer_heartbeat(beat: ev.NodeHeartbeat, batch: Batch, clock: Callable[[], datetime]) -> None:
    """Keep a node's heartbeat for the batch's one lease update (``store.record_heartbeats``): of a node's
    beats in a batch the one of its highest epoch counts, the later one where equal (a beat of an older epoch
    would have been refused by the update's guard anyway). The update runs before the batch's placement cycle;
    lease checks run in transactions of their own."""
    beats: dict[str, ev.NodeHeartbeat] = batch.memo.setdefault("heartbeats", {})  # type: ignore[assignment]
    earlier = beats.get(beat.node_id)
    if earlier is None or beat.lease_epoch >= earlier.lease_epoch:
        beats[beat.node_id] = beat
    batch.after("heartbeats", lambda c: store.record_heartbeats(c, list(beats.values()), clock()))
