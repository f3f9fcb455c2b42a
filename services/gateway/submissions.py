"""The gateway's submission routes: ``POST /v1/jobs`` (a JobSpec as JSON, or a pod spec as YAML) and
``POST /v1/jobs:batch`` (many JobSpecs in one request). Each job: the tenant from the caller's identity
(``gpusched_core.access``), the same checks admission makes (``gpusched_core.submission``: every reason, as
a 422), an id derived from the Idempotency-Key when one is sent (a retry creates no second job), then
published signed as the gateway's producer, attesting the caller; the answer waits for the broker's ack.
Admission still decides: ``state`` is ``Submitted`` until it has."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from opentelemetry import trace

from gpusched_common import events as ev
from gpusched_common.jobs import new_job_id, submission_bytes
from gpusched_common.tracing import current_traceparent, tracer
from gpusched_core.access import Action, Decision, Principal, Resource, authorize, never
from gpusched_core.arrays import ArrayError, ArrayRequest, parse_array, task_specs
from gpusched_core.submission import (
    AdmissionLimits,
    check_against_tenancy,
    check_job,
    check_spec,
    with_resolved_model,
)

from services.gateway import core, store
from services.gateway.auth import Caller, Problem, acts, allowed, within_rate
from services.gateway.publisher import NotPublished

router = APIRouter()
LIMITS = AdmissionLimits()
SUBMITTED = "Submitted"  # accepted onto the bus; admission has not decided yet
IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


def _job_body(job_id: str, tenant: str, state: str, replayed: bool, warnings: tuple[str, ...] = ()) -> dict[str, Any]:
    """A submission's answer; ``warnings``: what its YAML asks for that gpusched does not do."""
    body = {"job_id": job_id, "tenant": tenant, "state": state, "replayed": replayed}
    return {**body, "warnings": list(warnings)} if warnings else body


async def _checked(request: Request, spec: ev.JobSpec, job_id: str) -> tuple[str, ...]:
    """Every reason admission would refuse ``spec`` for: the cluster's limits and GPU models, then the
    tenancy in force, then its dependencies (each a job of the same tenant)."""
    now = datetime.now(UTC)
    async with request.app.state.pool.acquire() as conn:
        tenancy = await request.app.state.tenancy.current(conn, now)
        models = await request.app.state.models.current(conn, now, tenancy.flavors if tenancy is not None else ())
    reasons = check_spec(spec, LIMITS, models) + check_job(job_id, spec)
    if reasons:
        return reasons
    resolved = with_resolved_model(spec, models)  # the tenancy's flavors name models as the cluster does
    reasons = check_against_tenancy(job_id, resolved, tenancy) if tenancy is not None else ()
    if reasons:
        return reasons
    unknown = await _unknown_dependencies(request, spec.tenant, {d.job_id for d in spec.after})
    return tuple(f"no job {job_id} to wait for" for job_id in sorted(unknown))


async def _unknown_dependencies(request: Request, tenant: str, job_ids: set[str]) -> set[str]:
    """The dependencies that are no job of ``tenant`` (another tenant's job is as unknown as none). A job
    submitted a moment ago is waited for up to ``gateway_follow_wait_s`` (admission records it first)."""
    deadline = time.monotonic() + request.app.state.settings.gateway_follow_wait_s
    missing = set(job_ids)
    while missing:
        async with request.app.state.pool.acquire() as conn:
            tenants = await store.job_tenants(conn, sorted(missing))
        if any(t != tenant for t in tenants.values()):
            return {job_id for job_id, t in tenants.items() if t != tenant}
        missing -= set(tenants)
        if not missing or time.monotonic() >= deadline:
            return missing
        await asyncio.sleep(0.1)
    return set()


def _no_user_array(kind: str, doc: Any) -> None:
    if kind == "json" and isinstance(doc, dict) and doc.get("array") is not None:
        raise core.BadBody(422, ("an array is asked for with ?array=0-99%8 (or the gpusched.io/array annotation), "
                                 "not with the spec's 'array' field",))


def _record(spec: ev.JobSpec, job_id: str, request_id: str | None, principal: Principal,
            hold: bool = False) -> tuple[str, bytes, str | None]:
    traceparent = current_traceparent()
    value = submission_bytes(spec, job_id, traceparent=traceparent, request_id=request_id, producer="gateway",
                             submitted_by=principal.subject, hold=hold)
    return job_id, value, traceparent


async def _publish(request: Request, records: list[tuple[str, bytes, str | None]]) -> None:
    try:
        await request.app.state.publisher.publish(records)
    except NotPublished as exc:
        raise Problem(503, f"the submission was not accepted: {exc}; retry (with the same Idempotency-Key)",
                      {"Retry-After": "1"}) from None


@router.post("/v1/jobs", status_code=201, openapi_extra={
    **acts(Action.JOB_SUBMIT),
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
        "application/yaml": {"schema": {"type": "string", "description": "a Kubernetes pod spec"}}}}})
async def submit_job(request: Request, principal: Caller, idempotency_key: IdempotencyKey = None,
                     hold: bool = False, array: Annotated[str | None, Query(max_length=200)] = None) -> JSONResponse:
    """Submit one job. The tenant may be omitted by a caller bound to one; naming another is 403.
    ``hold=true``: admitted held, waiting for a release. ``array=0-99%8``: a job array, one job per index
    (``<array id>.<index>``; at most 8 hold GPUs at once), each told ``GPUSCHED_ARRAY_INDEX``."""
    within_rate(request, principal, "submit")
    if idempotency_key is not None and not core.valid_idempotency_key(idempotency_key):
        raise Problem(400, "the Idempotency-Key must be 1-100 letters, digits and ._:- starting with a letter or digit")
    try:
        kind, doc = core.job_document(request.headers.get("content-type"), await request.body())
        tenant = allowed(principal, Action.JOB_SUBMIT, Resource.in_tenant(core.named_tenant(kind, doc)))
        assert tenant is not None  # a submission is always for one tenant
        _no_user_array(kind, doc)
        spec, file_array, warnings = core.build_job(kind, doc, tenant)
        array = array or file_array
        tasks = parse_array(array) if array is not None else None
    except core.BadBody as exc:
        raise Problem(exc.status, str(exc), reasons=list(exc.reasons)) from None
    except ArrayError as exc:
        raise Problem(422, str(exc), reasons=[str(exc)]) from None
    derived, request_id = core.request_ids(tenant, idempotency_key)
    if tasks is not None:
        return await _submit_array(request, principal, spec, tasks, derived or new_job_id(), request_id, hold,
                                   warnings)
    job_id = derived or new_job_id()
    if derived is not None:
        async with request.app.state.pool.acquire() as conn:
            existing = await store.job_states(conn, [job_id])
        if job_id in existing:
            return JSONResponse(_job_body(job_id, tenant, existing[job_id], True, warnings), status_code=200)
    reasons = await _checked(request, spec, job_id)
    if reasons:
        raise Problem(422, "; ".join(reasons), reasons=list(reasons))
    with tracer().start_as_current_span("gateway submit", kind=trace.SpanKind.PRODUCER, attributes={
            "gpusched.job_id": job_id, "gpusched.tenant": tenant}):
        await _publish(request, [_record(spec, job_id, request_id, principal, hold)])
    return JSONResponse(_job_body(job_id, tenant, SUBMITTED, False, warnings), status_code=201,
                        headers={"Location": f"/v1/jobs/{job_id}"})


async def _submit_array(request: Request, principal: Principal, spec: ev.JobSpec, tasks: ArrayRequest,
                        array_id: str, request_id: str | None, hold: bool,
                        warnings: tuple[str, ...] = ()) -> JSONResponse:
    """Publish one job per task of the array (all or none are judged: the tasks differ only in index);
    ``warnings``: what its YAML asks for that gpusched does not do."""
    specs = task_specs(spec, array_id, tasks)
    body = {"job_id": array_id, "array_id": array_id, "tenant": spec.tenant, "tasks": len(specs),
            "indices": tasks.describe(), **({"warnings": list(warnings)} if warnings else {})}
    async with request.app.state.pool.acquire() as conn:
        existing = await store.job_states(conn, [specs[0][0]])
    if existing:
        return JSONResponse({**body, "state": SUBMITTED, "replayed": True}, status_code=200)
    reasons = await _checked(request, specs[0][1], specs[0][0])
    if reasons:
        raise Problem(422, "; ".join(reasons), reasons=list(reasons))
    within_rate(request, principal, "submit", cost=len(specs) - 1)  # one token per task (one taken already)
    with tracer().start_as_current_span("gateway submit array", kind=trace.SpanKind.PRODUCER, attributes={
            "gpusched.array_id": array_id, "gpusched.tenant": spec.tenant, "gpusched.jobs": len(specs)}):
        await _publish(request, [_record(task, job_id, request_id and f"{request_id}.{task.array.index}",  # type: ignore[union-attr]
                                         principal, hold) for job_id, task in specs])
    return JSONResponse({**body, "state": SUBMITTED, "replayed": False}, status_code=201,
                        headers={"Location": f"/v1/jobs?array={array_id}"})


@router.post("/v1/jobs:batch", openapi_extra={
    **acts(Action.JOB_SUBMIT),
    "requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["jobs"],
        "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/JobSpec"}}}}}}}})
async def submit_batch(request: Request, principal: Caller, idempotency_key: IdempotencyKey = None,
                       hold: bool = False) -> dict[str, Any]:
    """Submit many jobs in one request. Each is judged alone: ``results`` says, in order, each job's id and
    state, or its status and reasons; the valid ones are published even when others are refused."""
    refused = never(principal, Action.JOB_SUBMIT)
    if refused is not None:
        raise Problem(refused.status, refused.reason)
    if idempotency_key is not None and not core.valid_idempotency_key(idempotency_key):
        raise Problem(400, "the Idempotency-Key must be 1-100 letters, digits and ._:- starting with a letter or digit")
    try:
        kind, doc = core.job_document(request.headers.get("content-type"), await request.body())
    except core.BadBody as exc:
        raise Problem(exc.status, str(exc), reasons=list(exc.reasons)) from None
    items = doc.get("jobs") if kind == "json" else None
    if not isinstance(items, list) or not items:
        raise Problem(422, 'a batch is a JSON object {"jobs": [JobSpec, ...]} with at least one job')
    if len(items) > request.app.state.settings.gateway_max_batch:
        raise Problem(413, f"a batch holds at most {request.app.state.settings.gateway_max_batch} jobs, got {len(items)}")
    within_rate(request, principal, "submit", cost=len(items))
    results: list[dict[str, Any]] = []
    accepted: list[tuple[int, ev.JobSpec, str, str | None]] = []
    for index, item in enumerate(items):
        outcome = _batch_item(principal, index, item, idempotency_key)
        if isinstance(outcome, dict):
            results.append(outcome)
        else:
            results.append({})
            accepted.append(outcome)
    async with request.app.state.pool.acquire() as conn:
        existing = await store.job_states(conn, [job_id for _, _, job_id, _ in accepted])
        tenancy = await request.app.state.tenancy.current(conn, datetime.now(UTC))
        models = await request.app.state.models.current(conn, datetime.now(UTC),
                                                        tenancy.flavors if tenancy is not None else ())
    records = []
    with tracer().start_as_current_span("gateway submit batch", kind=trace.SpanKind.PRODUCER,
                                        attributes={"gpusched.jobs": len(accepted)}):
        for index, spec, job_id, request_id in accepted:
            if job_id in existing:
                results[index] = {"index": index, **_job_body(job_id, spec.tenant, existing[job_id], True)}
                continue
            reasons = check_spec(spec, LIMITS, models) or (
                check_against_tenancy(job_id, with_resolved_model(spec, models), tenancy) if tenancy is not None else ())
            reasons = reasons or tuple(f"no job {d} to wait for" for d in sorted(
                await _unknown_dependencies(request, spec.tenant, {d.job_id for d in spec.after})))
            if reasons:
                results[index] = {"index": index, "status": 422, "reasons": list(reasons)}
                continue
            records.append(_record(spec, job_id, request_id, principal, hold))
            results[index] = {"index": index, **_job_body(job_id, spec.tenant, SUBMITTED, False)}
        if records:
            await _publish(request, records)
    return {"accepted": sum(1 for r in results if "job_id" in r), "refused": sum(1 for r in results if "status" in r),
            "results": results}


def _batch_item(principal: Principal, index: int, item: Any,
                idempotency_key: str | None) -> dict[str, Any] | tuple[int, ev.JobSpec, str, str | None]:
    """One job of a batch: (index, spec, job id, request id), or its refusal as a result entry."""
    if not isinstance(item, dict):
        return {"index": index, "status": 422, "reasons": ["a job is a JSON object (a JobSpec)"]}
    decision: Decision = authorize(principal, Action.JOB_SUBMIT, Resource.in_tenant(core.named_tenant("json", item)))
    if not decision.allowed or decision.tenant is None:
        return {"index": index, "status": decision.status, "reasons": [decision.reason]}
    try:
        _no_user_array("json", item)
        spec = core.build_spec("json", item, decision.tenant)
    except core.BadBody as exc:
        return {"index": index, "status": exc.status, "reasons": list(exc.reasons)}
    derived, request_id = core.request_ids(decision.tenant, idempotency_key, index)
    job_id = derived or new_job_id()
    reasons = check_spec(spec, LIMITS) + check_job(job_id, spec)
    if reasons:
        return {"index": index, "status": 422, "reasons": list(reasons)}
    return index, spec, job_id, request_id
