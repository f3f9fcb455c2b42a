"""The gateway's routes, each small: authenticate (a bearer token -> ``Principal``), authorize (one
``gpusched_core.access`` decision, whose tenant scopes the SQL), load (``store`` and
``gpusched_common.stores``), answer. Each ``/v1`` route names its action in ``openapi_extra``
(``x-gpusched-action``), which the route matrix test reads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from gpusched_common import tokens
from gpusched_common.stores import jobs as history
from gpusched_common.stores.cluster import node_inventory
from gpusched_common.stores.quota import usage_by_flavor
from gpusched_core.access import Action, Principal, Resource, authorize
from gpusched_core.lifecycle import JobStatus

from services.gateway import core, store

router = APIRouter()
ACTION_KEY = "x-gpusched-action"


class Problem(Exception):
    """An answer that is a problem detail (``app`` renders it)."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


class AuthFailures:
    """Refused credentials by reason, for ``/metrics`` (a registry of this app's own: one count per process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counter = Counter("gpusched_gateway_auth_failures", "Requests refused for their credentials.",
                               ["reason"], registry=self.registry)

    def count(self, reason: str) -> None:
        self.counter.labels(reason=reason).inc()

    def prometheus(self) -> bytes:
        return generate_latest(self.registry)


def _acts(action: Action) -> dict[str, Any]:
    return {ACTION_KEY: action.value}


def _refuse(request: Request, reason: str, detail: str) -> Problem:
    request.app.state.auth_failures.count(reason)
    return Problem(401, detail, {"WWW-Authenticate": 'Bearer realm="gpusched"'})


async def authenticate(request: Request) -> Principal:
    """The principal of the request's bearer token; 401 (counted by reason) otherwise. The token is never
    logged nor echoed."""
    header = request.headers.get("authorization")
    if not header:
        raise _refuse(request, "missing", "no credentials: send Authorization: Bearer <token>")
    scheme, _, text = header.partition(" ")
    if scheme.lower() != "bearer" or not text.strip():
        raise _refuse(request, "malformed", "the Authorization header is not of the form Bearer <token>")
    async with request.app.state.pool.acquire() as conn:
        verified = await tokens.verify(conn, text.strip(), datetime.now(UTC))
    if isinstance(verified, tokens.TokenRefusal):
        raise _refuse(request, verified.reason.value, str(verified))
    return verified


Caller = Annotated[Principal, Depends(authenticate)]


def _allowed(principal: Principal, action: Action, resource: Resource) -> str | None:
    """The tenant the request is allowed for (None: cluster-wide); the Decision's status and reason else."""
    decision = authorize(principal, action, resource)
    if not decision.allowed:
        raise Problem(decision.status, decision.reason)
    return decision.tenant


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> dict[str, str]:
    try:
        async with request.app.state.pool.acquire(timeout=2.0) as conn:
            await store.ping(conn)
    except Exception as exc:  # noqa: BLE001 - whatever keeps the database from answering means not ready
        raise Problem(503, f"the database is not reachable ({type(exc).__name__})") from None
    return {"status": "ready"}


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.auth_failures.prometheus(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/jobs", openapi_extra=_acts(Action.JOB_LIST))
async def list_jobs(request: Request, principal: Caller, state: JobStatus | None = None, tenant: str | None = None,
                    limit: Annotated[int, Query(ge=1, le=500)] = 50, cursor: str | None = None) -> dict[str, Any]:
    scoped = _allowed(principal, Action.JOB_LIST, Resource.in_tenant(tenant))
    try:
        after = core.decode_cursor(cursor) if cursor else None
    except core.BadCursor as exc:
        raise Problem(400, str(exc)) from None
    async with request.app.state.pool.acquire() as conn:
        rows = await store.list_jobs(conn, tenant=scoped, state=state.value if state else None, after=after,
                                     limit=limit)
    page = rows[:limit]
    more = len(rows) > limit
    return {"jobs": [{k: v for k, v in r.items() if k != "sort_at"} for r in page],
            "next": core.encode_cursor(page[-1]["sort_at"], page[-1]["job_id"]) if more else None}


@router.get("/v1/jobs/{job_id}", openapi_extra=_acts(Action.JOB_READ))
async def read_job(request: Request, principal: Caller, job_id: str) -> dict[str, Any]:
    async with request.app.state.pool.acquire() as conn:
        job = await store.load_job(conn, job_id)
        # the submitting subject is not recorded yet; reads are judged by tenant only
        resource = Resource.job(job["tenant"] or "", "") if job is not None else Resource.missing_job()
        scoped = _allowed(principal, Action.JOB_READ, resource) or None  # a job's own tenant, or any
        if job is None:  # authorize refuses a missing job already; this only keeps the type checker honest
            raise Problem(404, authorize(principal, Action.JOB_READ, resource).reason)
        job["events"] = await history.job_history(conn, job_id)
        if job["state"] in (JobStatus.ADMITTED.value, JobStatus.QUEUED.value):
            waiting = await store.waiting_jobs(conn, scoped, datetime.now(UTC))
            entry = next((w for w in waiting if w["job_id"] == job_id), None)
            job["waiting"] = {k: entry[k] for k in ("queue", "position", "reason")} if entry else None
    return job


@router.get("/v1/queue", openapi_extra=_acts(Action.QUEUE_READ))
async def queue(request: Request, principal: Caller, tenant: str | None = None) -> dict[str, Any]:
    scoped = _allowed(principal, Action.QUEUE_READ, Resource.in_tenant(tenant))
    sees_jobs = authorize(principal, Action.JOB_LIST, Resource.in_tenant(scoped)).allowed
    async with request.app.state.pool.acquire() as conn:
        waiting = await store.waiting_jobs(conn, scoped, datetime.now(UTC))
    return {"tenant": scoped, "jobs": [core.queue_view(w, sees_jobs) for w in waiting]}


@router.get("/v1/tenants", openapi_extra=_acts(Action.TENANTS_READ))
async def tenants(request: Request, principal: Caller, tenant: str | None = None) -> dict[str, Any]:
    scoped = _allowed(principal, Action.TENANTS_READ, Resource.in_tenant(tenant))
    async with request.app.state.pool.acquire() as conn:
        usage = await usage_by_flavor(conn, scoped)
    return {"tenant": scoped, "usage": [
        {**u, "borrowed_units": core.borrowed_units(u["reserved_units"], u["nominal_units"])} for u in usage]}


@router.get("/v1/nodes", openapi_extra=_acts(Action.NODES_READ))
async def nodes(request: Request, principal: Caller) -> dict[str, Any]:
    _allowed(principal, Action.NODES_READ, Resource.cluster())
    async with request.app.state.pool.acquire() as conn:
        return {"nodes": await node_inventory(conn)}


def problem_response(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(core.problem(status, detail), status_code=status, headers=headers,
                        media_type=core.PROBLEM_TYPE)
