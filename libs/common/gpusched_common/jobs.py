"""Job streams in the event store: load a job's state, append its new events with the outbox and the
`jobs` read model, all inside the caller's transaction."""

from __future__ import annotations



import uuid
from dataclasses import replace
from datetime import datetime, timezone

import asyncpg
from opentelemetry import trace

from gpusched_common.ignored import Ignored
from gpusched_common import events as ev
from gpusched_common import store
from gpusched_core.lifecycle import JobState, JobStatus, evolve
from gpusched_common.ids import job_stream
from gpusched_common.topics import JOBS_EVENTS
from gpusched_common.tracing import context_from_traceparent, current_traceparent, tracer



def new_job_id() -> str:
    """A fresh job id (random): for a submission that names none and carries no idempotency key."""
    return f"j-{uuid.uuid4().hex[:16]}"


def _envelope_bytes(payload: ev.Payload, stream_id: str, *, producer: str, tenant: str | None,
                    traceparent: str | None, now: datetime) -> bytes:
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=stream_id, occurred_at=now,
                                producer=producer, tenant=tenant, traceparent=traceparent)
    return envelope.model_dump_json().encode()


def control_bytes(payload: ev.CancelJob | ev.HoldJob | ev.ReleaseJob | ev.CordonNode, *, tenant: str | None = None,
                  traceparent: str | None = None, now: datetime | None = None) -> bytes:
    """A control request's envelope as the gateway sends it on ``gpusched.jobs.control`` (a job's on the
    job's stream, an operator's node request on the node's)."""
    stream = f"node-{payload.node_id}" if isinstance(payload, ev.CordonNode) else job_stream(payload.job_id)
    return _envelope_bytes(payload, stream, producer="gateway", tenant=tenant, traceparent=traceparent,
                           now=now or datetime.now(timezone.utc))


def submission_bytes(spec: ev.JobSpec, job_id: str, *, traceparent: str | None = None, now: datetime | None = None,
                     request_id: str | None = None, producer: str = "client", submitted_by: str | None = None,
                     hold: bool = False) -> bytes:
    """A ``JobSubmitted`` envelope as it goes on ``gpusched.jobs.submitted`` (``submitted_by``: the subject
    a producer that may attest names; admission ignores it from any other)."""
    now = now or datetime.now(timezone.utc)
    payload = ev.JobSubmitted(job_id=job_id, spec=spec, submitted_at=now, request_id=request_id,
                              submitted_by=submitted_by, hold=hold)
    return _envelope_bytes(payload, job_stream(job_id), producer=producer, tenant=spec.tenant,
                           traceparent=traceparent, now=now)


async def load_job(conn: asyncpg.Connection, job_id: str) -> JobState:
    state = JobState(job_id=job_id)
    trace_parent = None
    for stored in await store.load(conn, job_stream(job_id)):
        state = evolve(state, ev.parse_payload(stored.envelope))
        trace_parent = stored.envelope.traceparent or trace_parent
    return replace(state, trace_parent=trace_parent)


async def stored_payload(conn: asyncpg.Connection, envelope: ev.Envelope) -> ev.Payload | None:
    """A job event as the store recorded it: a message on ``gpusched.jobs.events`` is only a claim that the
    event was appended, so consumers act on the stored event, and not at all where the store has none by
    that id, type and stream (a forgery, counted in ``NOT_IN_STORE``)."""
    stored = await store.load_event(conn, envelope.event_id)
    if stored is None or stored.envelope.type != envelope.type or stored.envelope.stream_id != envelope.stream_id:
        NOT_IN_STORE.note(envelope.type, f"event {envelope.event_id[:40]} of stream {envelope.stream_id[:60]}")
        return None
    return ev.parse_payload(stored.envelope)


NOT_IN_STORE = Ignored("job events the event store does not hold")


async def append_job_events(conn: asyncpg.Connection, state: JobState, payloads: tuple[ev.Payload, ...], *,
                            producer: str, now: datetime) -> JobState:
    """Append `payloads` to the job's stream at the state's version, publish them through the outbox and
    update the read model. Returns the new state. Raises store.ConcurrencyError if the stream moved."""
    if not payloads:
        return state
    if state.trace_parent and not trace.get_current_span().get_span_context().is_valid:
        # deferred work (a reservation pass, a placement cycle) runs outside any message span: give it a
        # span in the job's own trace
        with tracer().start_as_current_span(f"{producer} {payloads[0].TYPE}",
                                            context=context_from_traceparent(state.trace_parent),
                                            attributes={"gpusched.job_id": state.job_id}):
            return await _append(conn, state, payloads, producer=producer, now=now)
    return await _append(conn, state, payloads, producer=producer, now=now)


async def _append(conn: asyncpg.Connection, state: JobState, payloads: tuple[ev.Payload, ...], *,
                  producer: str, now: datetime) -> JobState:
    traceparent = current_traceparent()
    tenant = _tenant(state, payloads)
    stream = job_stream(state.job_id)
    envelopes = [
        ev.make_envelope(p, event_id=str(uuid.uuid4()), stream_id=stream, occurred_at=now,
                         producer=producer, tenant=tenant, traceparent=traceparent)
        for p in payloads
    ]
    new_state = replace(state, trace_parent=traceparent or state.trace_parent)
    for payload in payloads:
        new_state = evolve(new_state, payload)
    # the events, their outbox rows and the read model in one statement: one round trip, not three
    await store.append(conn, stream, state.version, envelopes, outbox=(producer, JOBS_EVENTS.name, state.job_id),
                       then=(_PROJECT_SQL, _project_args(new_state, payloads, now)))
    return new_state


def _tenant(state: JobState, payloads: tuple[ev.Payload, ...]) -> str | None:
    if state.spec is not None:
        return state.spec.tenant
    for payload in payloads:
        spec = getattr(payload, "spec", None)
        if spec is not None:
            return spec.tenant
        tenant = getattr(payload, "tenant", None)
        if tenant:
            return tenant
    return None


_TIMESTAMP_COLUMN = {
    ev.JobAdmitted: "admitted_at",
    ev.JobRejected: "finished_at",
    ev.QuotaReserved: "queued_at",
    ev.JobPlaced: "placed_at",
    ev.JobStarted: "started_at",
    ev.JobSucceeded: "finished_at",
    ev.JobFailed: "finished_at",
    ev.JobCancelled: "finished_at",
}


_PROJECT_SQL = """
        INSERT INTO jobs (job_id, tenant, status, version, gpus, gpu_model, priority, node_id, gpu_indices,
                          exit_code, reasons, submitted_at, admitted_at, queued_at, placed_at, started_at,
                          finished_at, updated_at, submitted_by, name)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)
        ON CONFLICT (job_id) DO UPDATE SET
            status = EXCLUDED.status, version = EXCLUDED.version, node_id = EXCLUDED.node_id,
            gpu_indices = EXCLUDED.gpu_indices, exit_code = EXCLUDED.exit_code, reasons = EXCLUDED.reasons,
            admitted_at = coalesce(jobs.admitted_at, EXCLUDED.admitted_at),
            queued_at = coalesce(jobs.queued_at, EXCLUDED.queued_at),
            placed_at = coalesce(EXCLUDED.placed_at, jobs.placed_at),
            started_at = coalesce(EXCLUDED.started_at, jobs.started_at),
            finished_at = coalesce(jobs.finished_at, EXCLUDED.finished_at),
            updated_at = EXCLUDED.updated_at,
            submitted_by = coalesce(jobs.submitted_by, EXCLUDED.submitted_by), name = coalesce(jobs.name, EXCLUDED.name)
        """


def _project_args(state: JobState, payloads: tuple[ev.Payload, ...], now: datetime) -> tuple:
    """The read model's row for ``state`` after ``payloads`` ($1..$20 of ``_PROJECT_SQL``)."""
    spec = state.spec
    status = state.status.value if state.status else JobStatus.ADMITTED.value
    submitted_at = next((p.submitted_at for p in payloads if isinstance(p, ev.JobSubmitted | ev.JobAdmitted)), None)
    stamps = {_TIMESTAMP_COLUMN[type(p)]: now for p in payloads if type(p) in _TIMESTAMP_COLUMN}
    if submitted_at is None and state.version == len(payloads):
        submitted_at = now  # a rejection is the first event of its stream
    return (
        state.job_id, spec.tenant if spec else _tenant(state, payloads), status, state.version,
        (spec.whole_gpus or spec.gpus) if spec else None, spec.gpu_model if spec else None,
        spec.priority if spec else None,
        state.node_id, list(state.gpu_indices) or None, state.exit_code, list(state.last_reasons),
        submitted_at, stamps.get("admitted_at"), stamps.get("queued_at"), stamps.get("placed_at"),
        stamps.get("started_at"), stamps.get("finished_at"), now, state.submitted_by, spec.name if spec else None,
    )
