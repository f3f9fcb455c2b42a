"""Driving a live quota service from a test: admitted jobs published through a test outbox, and waiting on
what the service recorded."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from gpusched_core import lifecycle
from gpusched_common.db import connect, create_pool
from gpusched_common.ids import job_stream
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import build_broker
from gpusched_common.relay import OutboxRelay
from gpusched_common.settings import Settings
from gpusched_common.store import load
from tests.builders import a_job


async def admit(settings: Settings, job_id: str, tenant: str, gpus: int, model: str = "A100-80GB") -> None:
    """Record a job as admission would, and publish its events to the jobs topic (as a relay would)."""
    spec = a_job(job_id).tenant(tenant).gpus(gpus).model(model).spec()
    now = datetime.now(timezone.utc)
    conn = await connect(settings.database_url)
    try:
        async with conn.transaction():
            state = await load_job(conn, job_id)
            await append_job_events(conn, state, lifecycle.decide(state, lifecycle.RegisterSubmission(spec, now), now),
                                    producer="test-admission", now=now)
    finally:
        await conn.close()
    pool = await create_pool(settings.database_url)
    broker = build_broker(settings, client_id="test-admission")
    await broker.connect()
    try:
        await OutboxRelay(pool, broker, "test-admission", poll_interval_s=0.05).publish_pending()
    finally:
        await broker.stop()
        await pool.close()


async def events_of(database_url: str, job_id: str, event_type: str) -> list[dict]:
    conn = await connect(database_url)
    try:
        return [s.envelope.payload for s in await load(conn, job_stream(job_id)) if s.envelope.type == event_type]
    finally:
        await conn.close()


async def wait_for_event(database_url: str, job_id: str, event_type: str, *, timeout_s: float = 20.0,
                         containing: str = "") -> dict:
    """The job's latest ``event_type`` event (whose JSON contains ``containing``), once it is recorded."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = [e for e in await events_of(database_url, job_id, event_type) if containing in str(e)]
        if found:
            return found[-1]
        assert asyncio.get_running_loop().time() < deadline, f"no {event_type} for {job_id} ({containing!r})"
        await asyncio.sleep(0.1)
