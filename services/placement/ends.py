"""How a run ends on placement's side: an exit report recorded (a one-node job's with the batch's other reports,
``reports.defer_exit``), a job taken off a node through no fault of its own and queued again, a gang's other
members stopped."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common.batching import Batch
from gpusched_common.jobs import append_job_events, load_job

from gpusched_core import lifecycle
from gpusched_core.placement.cycle import bound_to_charge
from gpusched_core.placement.leases import REQUEUE_REASON_CODES

from services.placement import store
from services.placement.reports import current_report, defer_exit, flush_reports
from services.placement.store import SERVICE


async def on_exited(conn: asyncpg.Connection, report: ev.JobExitReported, now: datetime) -> bool:
    """One exit report alone (a batch of node reports records its ends together: ``record_exit``)."""
    batch = Batch()
    changed = await record_exit(conn, report, batch, now)
    await batch.finish(conn)
    return changed


async def record_exit(conn: asyncpg.Connection, report: ev.JobExitReported, batch: Batch, now: datetime) -> bool:
    """A node reports a run ended (the caller holds the cycle lock): unless the report is stale or of another
    run, the job's end is decided. A one-node job's events and the release of its GPUs are written with the
    batch's other reports at its end (``defer_exit``); a requeue or a gang's member at once. True when GPUs
    were given back (a cycle may place more)."""
    if not await current_report(conn, report, batch):
        return False
    if report.reason_code in REQUEUE_REASON_CODES:
        await flush_reports(conn, batch)
        reason = f"requeued from {report.node_id}: {REQUEUE_REASON_CODES[report.reason_code]}"
        return await requeue(conn, report.job_id, report.node_id, reason, now)
    state = await load_job(conn, report.job_id)
    events = lifecycle.decide(state, lifecycle.RecordExit(report.node_id, report.exit_code, report.runtime_s,
                                                          report.error), now)
    if not events:
        return False
    if len(state.node_ids) <= 1 and not isinstance(events[0], ev.GangMemberExited):
        defer_exit(batch, state, events, now)
        return True
    await flush_reports(conn, batch)  # a gang's end writes at once, after what the batch recorded before it
    await append_job_events(conn, state, events, producer=SERVICE, now=now)
    if isinstance(events[0], ev.GangMemberExited):  # the rest of the gang runs on; this node's GPUs are free
        await store.release_gpus(conn, report.job_id, report.node_id)
        return True
    # a gang that failed on one node: stop the members still running elsewhere
    await store.release_gpus(conn, report.job_id)
    await stop_members(conn, state, report.node_id, f"gang member on {report.node_id} ended the job", now)
    return True


async def requeue(conn: asyncpg.Connection, job_id: str, node_id: str, reason: str, now: datetime) -> bool:
    """Take a job off a node through no fault of its own and queue it for placement again."""
    state = await load_job(conn, job_id)
    events = lifecycle.decide(state, lifecycle.Requeue(node_id, reason), now)
    if not events:
        return False
    await append_job_events(conn, state, events, producer=SERVICE, now=now)
    await store.release_gpus(conn, job_id)
    await stop_members(conn, state, node_id, reason, now)  # a gang runs whole or not at all
    if isinstance(events[0], ev.JobCancelled):
        return True  # it was being cancelled: it ends here, and is not queued again
    assert state.spec is not None
    # requeued, it still runs on the model its quota is charged for
    await store.queue_for_placement(conn, job_id, bound_to_charge(state.spec, state.charged_model))
    return True


async def stop_members(conn: asyncpg.Connection, state: lifecycle.JobState, except_node: str, reason: str,
                       now: datetime) -> None:
    """Stop the job's gang members still running on nodes other than ``except_node``."""
    running = [n for n in state.node_ids if n != except_node and n not in state.exited_nodes]
    await store.stop_on(conn, state.job_id, running, reason, now, attempt=state.runs or None)
