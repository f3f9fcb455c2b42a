"""Node reports read a batch at a time: every sender's key in one query, every heartbeat in one update, the
batch's job starts and ends in a few statements for all (their lease epochs read at once, their events
appended, their StartJobs acknowledged and their GPUs given back together)."""

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


_DEFERRED = "deferred-reports"  # batch memo: the jobs whose start or end is to be written at the batch's end
_ACKNOWLEDGED = "acknowledged-starts"  # batch memo: the start reports whose StartJobs need no sending again
_RELEASED = "released-jobs"  # batch memo: the jobs that ended, whose GPUs go back at the batch's end
_LOST_EPOCHS = "lost-epochs"  # batch memo: the epoch at which each reporting node was declared lost
_FLUSH = "flush-reports"  # the batch's after-work key of ``flush_reports`` (sorted before its cycle)


async def record_start(conn: asyncpg.Connection, report: ev.JobStartReported, batch: Batch, now: datetime) -> None:
    """A node reports a run started: unless the node's epoch was declared lost or the report is of another run,
    the job's JobStarted is written, and its StartJob is no longer sent again, with the batch's other reports at
    its end (``flush_reports``; a handler that reads a job again calls it first)."""
    if not await current_report(conn, report, batch):
        return
    acknowledged: list[ev.JobStartReported] = batch.memo.setdefault(_ACKNOWLEDGED, [])  # type: ignore[assignment]
    acknowledged.append(report)
    batch.after(_FLUSH, lambda c: flush_reports(c, batch))
    state = await load_job(conn, report.job_id)
    defer_job_events(batch, state, lifecycle.decide(state, lifecycle.RecordStart(report.node_id, report.pid,
                                                                                 report.started_at), now),
                     producer=SERVICE, now=now)
    _deferred(batch).add(report.job_id)


async def current_report(conn: asyncpg.Connection, report: ev.JobStartReported | ev.JobExitReported,
                         batch: Batch) -> bool:
    """Whether a start or exit report is of the job's current run, from a node whose epoch was not declared lost
    (the batch's reports of the job so far written first: the same run reported again is judged on them)."""
    if report.job_id in _deferred(batch):
        await flush_reports(conn, batch)
    if is_stale(report.lease_epoch, await _lost_epoch(conn, batch, report.node_id)):
        return False  # the node was declared lost at this epoch and its jobs were requeued already
    return await this_run(conn, report)


def defer_exit(batch: Batch, state: lifecycle.JobState, events: tuple[ev.Payload, ...], now: datetime) -> None:
    """A one-node run ended: its events and the release of its GPUs are written with the batch's other reports
    at its end (``flush_reports``), before the batch's placement cycle."""
    defer_job_events(batch, state, events, producer=SERVICE, now=now)
    released: list[str] = batch.memo.setdefault(_RELEASED, [])  # type: ignore[assignment]
    released.append(state.job_id)
    batch.after(_FLUSH, lambda c: flush_reports(c, batch))
    _deferred(batch).add(state.job_id)


async def flush_reports(conn: asyncpg.Connection, batch: Batch) -> None:
    """Write the batch's starts and ends recorded so far: StartJobs acknowledged, GPUs given back, events
    appended."""
    acknowledged: list[ev.JobStartReported] = batch.memo.get(_ACKNOWLEDGED, [])  # type: ignore[assignment]
    if acknowledged:
        await starts.acknowledged_many(conn, acknowledged)
        acknowledged.clear()
    released: list[str] = batch.memo.get(_RELEASED, [])  # type: ignore[assignment]
    if released:
        await store.release_jobs(conn, released)
        released.clear()
    await flush_job_events(conn, batch, producer=SERVICE)
    _deferred(batch).clear()


def _deferred(batch: Batch) -> set[str]:
    return batch.memo.setdefault(_DEFERRED, set())  # type: ignore[return-value]


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
