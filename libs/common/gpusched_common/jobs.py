"""Job streams in the event store: load a job's state, append its new events with the outbox and the
`jobs` read model, all inside the caller's transaction."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import asyncpg
from opentelemetry import trace

from gpusched_common.ignored import Ignored
from gpusched_common import events as ev
from gpusched_common import store
from gpusched_core.lifecycle import JobState, JobStatus, evolve
from gpusched_common.ids import job_stream
from gpusched_common.topics import JOBS_EVENTS
from gpusched_common.tracing import context_from_traceparent, current_traceparent, tracer

if TYPE_CHECKING:
    from gpusched_common.batching import Batch


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
    return _state_of(job_id, await store.load(conn, job_stream(job_id)))


async def load_jobs(conn: asyncpg.Connection, job_ids: Sequence[str]) -> dict[str, JobState]:
    """``load_job`` for several jobs in one query."""
    streams = await store.load_streams(conn, [job_stream(j) for j in job_ids])
    return {j: _state_of(j, streams[job_stream(j)]) for j in job_ids}


def _state_of(job_id: str, stored_events: list[store.StoredEvent]) -> JobState:
    state = JobState(job_id=job_id)
    trace_parent = None
    for stored in stored_events:
        state = evolve(state, ev.parse_payload(stored.envelope))
        trace_parent = stored.envelope.traceparent or trace_parent
    return replace(state, trace_parent=trace_parent)


async def stored_payload(conn: asyncpg.Connection, envelope: ev.Envelope) -> ev.Payload | None:
    """A job event as the store recorded it: a message on ``gpusched.jobs.events`` is only a claim that the
    event was appended, so consumers act on the stored event, and not at all where the store has none by
    that id, type and stream (a forgery, counted in ``NOT_IN_STORE``)."""
    stored = await store.load_event(conn, envelope.event_id, envelope.stream_id)
    if stored is None or stored.envelope.type != envelope.type or stored.envelope.stream_id != envelope.stream_id:
        NOT_IN_STORE.note(envelope.type, f"event {envelope.event_id[:40]} of stream {envelope.stream_id[:60]}")
        return None
    return ev.parse_payload(stored.envelope)


NOT_IN_STORE = Ignored("job events the event store does not hold")


async def append_job_events(conn: asyncpg.Connection, state: JobState, payloads: tuple[ev.Payload, ...], *,
                            producer: str, now: datetime) -> JobState:
    """Append `payloads` to the job's stream at the state's version, publish them through the outbox and
    update the read model. Returns the new state. Raises store.ConcurrencyError if the stream moved."""
    return (await append_many_job_events(conn, [(state, payloads)], producer=producer, now=now))[0]


async def append_many_job_events(conn: asyncpg.Connection, changes: Sequence[tuple[JobState, tuple[ev.Payload, ...]]],
                                 *, producer: str, now: datetime) -> list[JobState]:
    """``append_job_events`` for several jobs in one statement (each job once); their new states, in order.
    Raises store.ConcurrencyError if any of their streams moved: then none is appended."""
    prepared = [_prepare(state, payloads, producer=producer, now=now) for state, payloads in changes]
    await write_prepared(conn, [p for p in prepared if p.append is not None], producer=producer)
    return [p.state for p in prepared]


@dataclass(frozen=True)
class PreparedAppend:
    """A job's decided events, enveloped (with the trace they were decided in) but not yet written."""

    state: JobState  # after the events
    append: store.StreamAppend | None  # None: no events
    row: dict[str, object] | None  # the read model's row after them


def _prepare(state: JobState, payloads: tuple[ev.Payload, ...], *, producer: str, now: datetime) -> PreparedAppend:
    if not payloads:
        return PreparedAppend(state, None, None)
    if state.trace_parent and not trace.get_current_span().get_span_context().is_valid:
        # deferred work (a reservation pass, a placement cycle) runs outside any message span: give it a
        # span in the job's own trace
        with tracer().start_as_current_span(f"{producer} {payloads[0].TYPE}",
                                            context=context_from_traceparent(state.trace_parent),
                                            attributes={"gpusched.job_id": state.job_id}):
            return _envelope(state, payloads, producer=producer, now=now)
    return _envelope(state, payloads, producer=producer, now=now)


def _envelope(state: JobState, payloads: tuple[ev.Payload, ...], *, producer: str, now: datetime) -> PreparedAppend:
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
    return PreparedAppend(new_state, store.StreamAppend(stream, state.version, envelopes, state.job_id),
                          _project_row(new_state, payloads, now))


async def write_prepared(conn: asyncpg.Connection, prepared: Sequence[PreparedAppend], *, producer: str) -> None:
    """The events, their outbox rows and the read model's rows of ``prepared``, in one statement."""
    if not prepared:
        return
    rows = json.dumps([p.row for p in prepared], default=_json_default)
    await store.append_many(conn, [p.append for p in prepared if p.append is not None],  # for the type checker
                            outbox=(producer, JOBS_EVENTS.name), then=(_PROJECT_SQL, (rows,)))


def defer_job_events(batch: Batch, state: JobState, payloads: tuple[ev.Payload, ...], *,
                     producer: str, now: datetime) -> JobState:
    """``append_job_events`` at the end of the batch, with every other job's deferred in the same batch: a
    batch of n decisions is one statement, not n. For a handler that reads nothing of what it appends later
    in the batch; a job decided twice in one batch fails the batch (``store.ConcurrencyError``), which is
    then applied message by message."""
    prepared = _prepare(state, payloads, producer=producer, now=now)
    if prepared.append is None:
        return state
    pending: list[PreparedAppend] = batch.memo.setdefault(f"job-appends:{producer}", [])  # type: ignore[assignment]
    pending.append(prepared)
    batch.after(f"job-appends:{producer}", lambda c: flush_job_events(c, batch, producer=producer))
    return prepared.state


async def flush_job_events(conn: asyncpg.Connection, batch: Batch, *, producer: str) -> None:
    """Write the batch's deferred appends now (a handler about to read one of their jobs again calls it)."""
    pending: list[PreparedAppend] = batch.memo.get(f"job-appends:{producer}", [])  # type: ignore[assignment]
    if pending:
        written = list(pending)
        pending.clear()
        await write_prepared(conn, written, producer=producer)


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


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
        SELECT * FROM jsonb_to_recordset($1::text::jsonb) AS r(job_id text, tenant text, status text, version integer,
            gpus integer, gpu_model text, priority integer, node_id text, gpu_indices integer[], exit_code integer,
            reasons jsonb, submitted_at timestamptz, admitted_at timestamptz, queued_at timestamptz,
            placed_at timestamptz, started_at timestamptz, finished_at timestamptz, updated_at timestamptz,
            submitted_by text, name text)
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


def _project_row(state: JobState, payloads: tuple[ev.Payload, ...], now: datetime) -> dict[str, object]:
    """The read model's row for ``state`` after ``payloads`` (a row of ``_PROJECT_SQL``)."""
    spec = state.spec
    status = state.status.value if state.status else JobStatus.ADMITTED.value
    submitted_at = next((p.submitted_at for p in payloads if isinstance(p, ev.JobSubmitted | ev.JobAdmitted)), None)
    stamps = {_TIMESTAMP_COLUMN[type(p)]: now for p in payloads if type(p) in _TIMESTAMP_COLUMN}
    if submitted_at is None and state.version == len(payloads):
        submitted_at = now  # a rejection is the first event of its stream
    return {
        "job_id": state.job_id, "tenant": spec.tenant if spec else _tenant(state, payloads), "status": status,
        "version": state.version, "gpus": (spec.whole_gpus or spec.gpus) if spec else None,
        "gpu_model": spec.gpu_model if spec else None, "priority": spec.priority if spec else None,
        "node_id": state.node_id, "gpu_indices": list(state.gpu_indices) or None, "exit_code": state.exit_code,
        "reasons": list(state.last_reasons), "submitted_at": submitted_at, **stamps, "updated_at": now,
        "submitted_by": state.submitted_by, "name": spec.name if spec else None,
    }
