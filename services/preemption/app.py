"""Preemption service: consumes placement deferrals and records an evaluation for each."""

from __future__ import annotations

from datetime import datetime, timezone

import asyncpg

from gpusched_common import events as ev
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.messaging import Incoming, PoisonMessage
from gpusched_common.runtime import Runtime, run_service
from gpusched_common.settings import Settings
from gpusched_common.store import claim
from gpusched_common.topics import GROUP_PREEMPTION, JOBS_EVENTS

from services.preemption.core import evaluate_deferral

SERVICE = "preemption"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def make_handler() -> TxHandler:
    async def on_job_event(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        try:
            envelope = ev.Envelope.model_validate_json(message.value)
            payload = ev.parse_payload(envelope)
        except ValueError as exc:
            raise PoisonMessage(f"unreadable event: {exc}") from exc
        if not isinstance(payload, ev.PlacementDeferred):
            return
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        evaluation = evaluate_deferral(payload.job_id, tuple(payload.reasons))
        await conn.execute(
            "INSERT INTO preemption_evaluations (job_id, evaluated_at, outcome, reasons) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (job_id) DO UPDATE SET evaluated_at = EXCLUDED.evaluated_at,"
            " outcome = EXCLUDED.outcome, reasons = EXCLUDED.reasons",
            evaluation.job_id, utcnow(), evaluation.outcome, list(evaluation.reasons))

    return on_job_event


async def setup(runtime: Runtime) -> None:
    runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_PREEMPTION, make_handler())


async def main(settings: Settings | None = None) -> None:
    await run_service(SERVICE, settings or Settings(), setup)
