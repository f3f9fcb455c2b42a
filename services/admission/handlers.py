"""Admission's Kafka edge: parse, dedupe, load, decide, append with the outbox (the transaction and the
offset commit around it belong to the batch consumer)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, PoisonMessage
from gpusched_common.store import claim

from services.admission.core import AdmissionLimits, Unparseable, parse_submission

SERVICE = "admission"


def make_submission_handler(limits: AdmissionLimits, clock: Callable[[], datetime]) -> TxHandler:
    async def on_submitted(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        try:
            submission = parse_submission(message.value, limits)
        except Unparseable as exc:
            raise PoisonMessage(str(exc)) from exc
        now = clock()
        command = decider.RegisterSubmission(
            spec=submission.spec, submitted_at=submission.submitted_at or now,
            rejection_reasons=submission.reasons, tenant_hint=submission.tenant_hint,
        )
        if not await claim(conn, SERVICE, submission.event_id):
            return
        state = await load_job(conn, submission.job_id)
        await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)

    return on_submitted
