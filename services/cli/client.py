"""Python client: publishes `JobSubmitted` for people and programs."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from faststream.kafka import KafkaBroker
from opentelemetry import trace

from gpusched_common import events as ev
from gpusched_common.messaging import build_broker, publish
from gpusched_common.settings import Settings
from gpusched_common.topics import JOBS_SUBMITTED
from gpusched_common.tracing import current_traceparent, tracer


def new_job_id() -> str:
    return f"j-{uuid.uuid4().hex[:16]}"


def submission_bytes(spec: ev.JobSpec, job_id: str, *, traceparent: str | None = None,
                     now: datetime | None = None) -> bytes:
    now = now or datetime.now(timezone.utc)
    payload = ev.JobSubmitted(job_id=job_id, spec=spec, submitted_at=now)
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"job-{job_id}", occurred_at=now,
                                producer="client", tenant=spec.tenant, traceparent=traceparent)
    return envelope.model_dump_json().encode()


class Client:
    """`async with Client(settings) as c: job_id = await c.submit(spec)`."""

    def __init__(self, settings: Settings) -> None:
        self._broker: KafkaBroker = build_broker(settings, client_id="gpusched-client")

    async def __aenter__(self) -> Client:
        await self._broker.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._broker.stop()

    async def submit(self, spec: ev.JobSpec, job_id: str | None = None) -> str:
        job_id = job_id or new_job_id()
        with tracer().start_as_current_span("client submit", kind=trace.SpanKind.PRODUCER,
                                            attributes={"gpusched.job_id": job_id, "gpusched.tenant": spec.tenant}):
            traceparent = current_traceparent()
            headers = {"event-type": ev.JobSubmitted.TYPE}
            if traceparent:
                headers["traceparent"] = traceparent
            await publish(self._broker, JOBS_SUBMITTED.name, job_id,
                          submission_bytes(spec, job_id, traceparent=traceparent), headers)
        return job_id

    async def submit_raw(self, key: str, value: bytes, headers: dict[str, str] | None = None) -> None:
        """Publish bytes as they are (tests and tools that exercise bad input)."""
        await publish(self._broker, JOBS_SUBMITTED.name, key, value, headers)
