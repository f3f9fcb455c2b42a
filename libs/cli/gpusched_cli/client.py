"""Python client: publishes `JobSubmitted` for people and programs."""

from __future__ import annotations

from faststream.kafka import KafkaBroker
from opentelemetry import trace

from gpusched_common import events as ev
from gpusched_common.credentials import key_for, load_keys, signed_headers
from gpusched_common.ids import job_id_for_request
from gpusched_common.jobs import new_job_id, submission_bytes
from gpusched_common.messaging import build_broker, publish
from gpusched_common.settings import Settings
from gpusched_common.topics import JOBS_SUBMITTED
from gpusched_common.tracing import current_traceparent, tracer


class Client:
    """`async with Client(settings) as c: job_id = await c.submit(spec)`.

    Submissions are signed with the tenant's key (or an operator key) from GPUSCHED_TENANT_KEYS_FILE."""

    def __init__(self, settings: Settings) -> None:
        self._broker: KafkaBroker = build_broker(settings, client_id="gpusched-client")
        self._keys = load_keys(settings.tenant_keys_file) if settings.tenant_keys_file else {}

    async def __aenter__(self) -> Client:
        await self._broker.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._broker.stop()

    async def submit(self, spec: ev.JobSpec, job_id: str | None = None, request_id: str | None = None) -> str:
        job_id = job_id or (job_id_for_request(spec.tenant, request_id) if request_id else new_job_id())
        with tracer().start_as_current_span("client submit", kind=trace.SpanKind.PRODUCER,
                                            attributes={"gpusched.job_id": job_id, "gpusched.tenant": spec.tenant}):
            traceparent = current_traceparent()
            value = submission_bytes(spec, job_id, traceparent=traceparent, request_id=request_id)
            headers = {"event-type": ev.JobSubmitted.TYPE}
            if traceparent:
                headers["traceparent"] = traceparent
            key = key_for(self._keys, spec.tenant)
            if key is not None:
                headers.update(signed_headers(key, value))
            await publish(self._broker, JOBS_SUBMITTED.name, job_id, value, headers)
        return job_id

    async def submit_raw(self, key: str, value: bytes, headers: dict[str, str] | None = None, *,
                         sign_as: str | None = None) -> None:
        """Publish bytes as they are (tests and tools that exercise bad input), signed with the key for
        tenant `sign_as` when given."""
        headers = dict(headers or {})
        signer = key_for(self._keys, sign_as) if sign_as else None
        if signer is not None:
            headers.update(signed_headers(signer, value))
        await publish(self._broker, JOBS_SUBMITTED.name, key, value, headers)
