"""Placement's queue from quota's reservations: a batch's reservations are queued together, in one statement
under the cycle lock, before the batch's cycle; the store's rows decide whether each job still waits (a batch
reads its messages' job streams at its start, before the lock: a job a cycle placed in between is never
queued again)."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_common import events as ev
from gpusched_common.batching import Batch
from gpusched_common.jobs import load_job
from gpusched_common.stores.cluster import lock_cycle
from gpusched_core import lifecycle
from gpusched_core.placement.cycle import bound_to_charge
from services.placement import store


async def lock_cycle_once(conn: asyncpg.Connection, batch: Batch) -> None:
    """The cycle lock for the rest of the batch's transaction, taken at its first need (one round trip a batch)."""
    if "cycle-locked" not in batch.memo:
        await lock_cycle(conn)
        batch.memo["cycle-locked"] = True


_RESERVED = "placement-reserved"


async def defer_reservation(conn: asyncpg.Connection, reserved: ev.QuotaReserved, batch: Batch) -> bool:
    """A reservation in a batch: its job queued with the batch's others in one statement, under the cycle lock,
    before the batch's cycle (``flush_reservations``); False when the job, as the batch read it, waits for
    placement no more (placed already, or gone). The store's rows have the last word when it is queued."""
    if (await load_job(conn, reserved.job_id)).status is not lifecycle.JobStatus.QUEUED:
        return False
    batch.memo.setdefault(_RESERVED, []).append(reserved)  # type: ignore[union-attr]
    return True


async def flush_reservations(conn: asyncpg.Connection, batch: Batch) -> None:
    """Queue the batch's reservations so far, in their order, in one statement (``queue_many_if_waiting``)."""
    reserved: list[ev.QuotaReserved] = batch.memo.get(_RESERVED, [])  # type: ignore[assignment]
    if reserved:
        await lock_cycle_once(conn, batch)
        await store.queue_many_if_waiting(conn, [(r.job_id, bound_to_charge(r.spec, r.gpu_model)) for r in reserved])
        reserved.clear()


async def on_reserved(conn: asyncpg.Connection, reserved: ev.QuotaReserved, now: datetime) -> bool:
    """A reservation on its own (a batch defers its reservations: ``defer_reservation``)."""
    if (await load_job(conn, reserved.job_id)).status is not lifecycle.JobStatus.QUEUED:
        return False  # placed already (the store's pass queued it before this message came), or gone
    # ``apply`` took the cycle lock, but the job's stream may come from a batch's earlier read: the store decides
    return await store.queue_if_waiting(conn, reserved.job_id, bound_to_charge(reserved.spec, reserved.gpu_model))
