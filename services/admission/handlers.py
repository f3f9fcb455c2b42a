"""Admission's Kafka edge: parse, dedupe, load, decide, append with the outbox, commit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from gpusched_common import decider
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, PoisonMessage
from gpusched_common.runtime import Runtime
from gpusched_common.store import claim

from services.admission.core import AdmissionLimits, Unparseable, parse_submission

SERVICE = "admission"


def make_submission_handler(runtime: Runtime, limits: AdmissionLimits, clock: Callable[[], datetime]):
    async def on_submitted(message: Incoming) -> None:
        try:
            submission = parse_submission(message.value, limits)
        except Unparseable as exc:
            raise PoisonMessage(str(exc)) from exc
        now = clock()
        command = decider.RegisterSubmission(
            spec=submission.spec, submitted_at=submission.submitted_at or now,
            rejection_reasons=submission.reasons, tenant_hint=submission.tenant_hint,
        )
        async with runtime.pool.acquire() as conn, conn.transaction():
            if not await claim(conn, SERVICE, submission.event_id):
                return
            state = await load_job(conn, submission.job_id)
            await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)
        runtime.wake_relay()

    return on_submitted
