"""Node reports read a batch at a time: every sender's key in one query, every heartbeat in one update, the
batch's job starts in a few statements for all (their lease epochs read at once, their events appended and
their StartJobs acknowledged together)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common import node_keys
from gpusched_common.batching import Batch
from gpusched_common.ignored import Ignored
from gpusched_common.jobs import defer_job_events, flush_job_events, load_job
from gpusched_common.signing import SENDER_HEADER
from gpusched_common.topics import NODES_REPORTS

from gpusched_core import lifecycle
from gpusched_core.placement.leases import is_stale, other_run

from services.placement import starts, store
from services.placement.store import SERVICE


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


_DEFERRED_STARTS = "deferred-starts"  # batch memo: the jobs whose start is to be written at the batch's end
_ACKNOWLEDGED = "acknowledged-starts"  # batch memo: the start reports whose StartJobs need no sending again
_LOST_EPOCHS = "lost-epochs"  # batch memo: the epoch at which each reporting node was declared lost


async def record_start(conn: asyncpg.Connection, report: ev.JobStartReported, batch: Batch, now: datetime) -> None:
    """A node reports a run started: unless the node's epoch was declared lost or the report is of another run,
    the job's JobStarted is written, and its StartJob is no longer sent again, with the batch's other starts at
    its end (``flush_starts``; a handler that reads a job again calls it first)."""
    deferred: set[str] = batch.memo.setdefault(_DEFERRED_STARTS, set())  # type: ignore[assignment]
    if report.job_id in deferred:
        await flush_starts(conn, batch)  # the same run reported again in the batch: decided on what is written
    if is_stale(report.lease_epoch, await _lost_epoch(conn, batch, report.node_id)) or not await this_run(conn, report):
        return
    acknowledged: list[ev.JobStartReported] = batch.memo.setdefault(_ACKNOWLEDGED, [])  # type: ignore[assignment]
    acknowledged.append(report)
    batch.after(_ACKNOWLEDGED, lambda c: flush_starts(c, batch))
    state = await load_job(conn, report.job_id)
    defer_job_events(batch, state, lifecycle.decide(state, lifecycle.RecordStart(report.node_id, report.pid,
                                                                                 report.started_at), now),
                     producer=SERVICE, now=now)
    deferred.add(report.job_id)


async def flush_starts(conn: asyncpg.Connection, batch: Batch) -> None:
    """Write the batch's starts recorded so far: their StartJobs acknowledged, their events appended."""
    acknowledged: list[ev.JobStartReported] = batch.memo.get(_ACKNOWLEDGED, [])  # type: ignore[assignment]
    if acknowledged:
        await starts.acknowledged_many(conn, acknowledged)
        acknowledged.clear()
    await flush_job_events(conn, batch, producer=SERVICE)
    batch.memo.get(_DEFERRED_STARTS, set()).clear()  # type: ignore[union-attr]


async def _lost_epoch(conn: asyncpg.Connection, batch: Batch, node_id: str) -> int | None:
    """The epoch at which the node was declared lost (None: never), read for every reporting node of the batch
    in one query (only a lease check, in a transaction of its own, declares a node lost)."""
    lost: dict[str, int | None] | None = batch.memo.get(_LOST_EPOCHS)  # type: ignore[assignment]
    if lost is None:
        senders = sorted({m.key for m in batch.messages if m.topic == NODES_REPORTS.name and m.key} | {node_id})
        lost = batch.memo[_LOST_EPOCHS] = await store.lost_epochs(conn, senders)
    if node_id not in lost:
        lost[node_id] = await store.lost_epoch(conn, node_id)
    return lost[node_id]


OTHER_RUN = Ignored("reports of another run or node than the job's")


async def this_run(conn: asyncpg.Connection,
                   report: ev.JobStartReported | ev.JobCheckpointReported | ev.JobExitReported) -> bool:
    """Whether the report is of the job's current run on a node it runs on (else ignored and counted)."""
    state = await load_job(conn, report.job_id)
    why = other_run(state.node_ids, state.runs, report.node_id, report.attempt)
    if why is not None:
        OTHER_RUN.note(report.TYPE, f"{report.job_id[:60]}: {why}")
    return why is None
