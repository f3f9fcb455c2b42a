"""The gateway's routes, each small: authenticate (a bearer token -> ``Principal``), authorize (one
``gpusched_core.access`` decision, whose tenant scopes the SQL), load (``store`` and
``gpusched_common.stores``), answer. Each ``/v1`` route names its action in ``openapi_extra``
(``x-gpusched-action``), which the route matrix test reads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from gpusched_common.stores import jobs as history
from gpusched_common.stores.cluster import node_inventory
from gpusched_common.stores import dashboard
from gpusched_common.stores.quota import load_history, usage_by_flavor
from gpusched_core.access import Action, Resource, authorize
from gpusched_core.dashboard import plan_tenants
from gpusched_core.lifecycle import JobStatus

from services.gateway import core, store
from services.gateway.auth import Caller, Problem, acts, allowed, within_rate

router = APIRouter()


@router.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", include_in_schema=False)
async def readyz(request: Request) -> dict[str, str]:
    """Ready when the database answers and the broker does (where this gateway has a producer key)."""
    try:
        async with request.app.state.pool.acquire(timeout=2.0) as conn:
            await store.ping(conn)
    except Exception as exc:  # noqa: BLE001 - whatever keeps the database from answering means not ready
        raise Problem(503, f"the database is not reachable ({type(exc).__name__})") from None
    publisher = request.app.state.publisher
    if publisher.key is not None:
        broker = await publisher.ready()
        if broker is not None:
            raise Problem(503, broker)
    return {"status": "ready", "submissions": "on" if publisher.key is not None else "off: no producer key"}


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request) -> Response:
    return Response(request.app.state.auth_failures.prometheus(), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/jobs", openapi_extra=acts(Action.JOB_LIST))
async def list_jobs(request: Request, principal: Caller, state: JobStatus | None = None, tenant: str | None = None,
                    name: Annotated[str | None, Query(max_length=128)] = None, since: datetime | None = None,
                    until: datetime | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 50,
                    cursor: str | None = None,
                    array: Annotated[str | None, Query(max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9:-]*$")] = None,
                    ) -> dict[str, Any]:
    """Jobs newest first: of a ``state``, a ``tenant`` (the caller's own unless it may see others), a
    ``name``, submitted ``since``/``until`` (ISO 8601 with a zone), the tasks of job ``array``; ``next``
    is the cursor of the next page."""
    within_rate(request, principal, "read")
    scoped = allowed(principal, Action.JOB_LIST, Resource.in_tenant(tenant))
    for label, at in (("since", since), ("until", until)):
        if at is not None and at.tzinfo is None:
            raise Problem(400, f"{label} must carry a time zone (e.g. 2026-12-01T00:00:00Z)")
    try:
        after = core.decode_cursor(cursor) if cursor else None
    except core.BadCursor as exc:
        raise Problem(400, str(exc)) from None
    async with request.app.state.pool.acquire() as conn:
        rows = await store.list_jobs(conn, tenant=scoped, state=state.value if state else None, after=after,
                                     limit=limit, name=name, since=since, until=until, array=array)
    page = rows[:limit]
    more = len(rows) > limit
    return {"jobs": [{k: v for k, v in r.items() if k != "sort_at"} for r in page],
            "next": core.encode_cursor(page[-1]["sort_at"], page[-1]["job_id"]) if more else None}


@router.get("/v1/jobs/{job_id}", openapi_extra=acts(Action.JOB_READ))
async def read_job(request: Request, principal: Caller, job_id: str) -> dict[str, Any]:
    within_rate(request, principal, "read")
    async with request.app.state.pool.acquire() as conn:
        job = await visible_job(conn, principal, Action.JOB_READ, job_id)
        scoped = job["tenant"]
        job["events"] = await history.job_history(conn, job_id)
        if job["state"] in (JobStatus.ADMITTED.value, JobStatus.QUEUED.value):
            waiting = await store.waiting_jobs(conn, scoped, datetime.now(UTC))
            entry = next((w for w in waiting if w["job_id"] == job_id), None)
            job["waiting"] = {k: entry[k] for k in ("queue", "position", "reason")} if entry else None
    return job


async def visible_job(conn: Any, principal: Any, action: Action, job_id: str) -> dict[str, Any]:
    """The job's row when the principal may do ``action`` to it; else the Decision's 403/404 (one 404 for
    another tenant's job and for none: nothing leaks)."""
    job = await store.load_job(conn, job_id)
    resource = Resource.job(job["tenant"] or "", job["submitted_by"] or "") if job else Resource.missing_job()
    allowed(principal, action, resource)
    if job is None:  # authorize refuses a missing job already; this only keeps the type checker honest
        raise Problem(404, authorize(principal, action, resource).reason)
    return job


@router.get("/v1/jobs/{job_id}/events", openapi_extra=acts(Action.JOB_EVENTS), response_model=None)
async def job_events(request: Request, principal: Caller, job_id: str, follow: bool = False,
                     after: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any] | StreamingResponse:
    """The job's events in order (after version ``after``). ``follow=true``: server-sent events, each
    event as it is appended (``id`` is its version: a reconnect sends Last-Event-ID), ending after the
    job's last event (it succeeded, failed, was cancelled or rejected)."""
    within_rate(request, principal, "read")
    if follow:  # a job followed right after its submission appears once admission has recorded it
        await _appeared(request, job_id)
    async with request.app.state.pool.acquire() as conn:
        await visible_job(conn, principal, Action.JOB_EVENTS, job_id)
        if not follow:
            return {"job_id": job_id, "events": await history.job_history(conn, job_id, after)}
    resume = request.headers.get("last-event-id", "")
    start = max(after, int(resume)) if resume.isdigit() else after
    return StreamingResponse(follow_events(request, job_id, start), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _appeared(request: Request, job_id: str) -> None:
    """Wait up to ``gateway_follow_wait_s`` for the job's row (the caller is judged after, whatever came)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.app.state.settings.gateway_follow_wait_s
    while True:
        async with request.app.state.pool.acquire() as conn:
            if await store.job_states(conn, [job_id]) or loop.time() >= deadline:
                return
        await asyncio.sleep(0.1)


async def follow_events(request: Request, job_id: str, after: int) -> AsyncIterator[bytes]:
    """Read the job's stream again every ``gateway_follow_poll_s`` (by its primary key: cheap) and send
    what is new; a comment line every 15 s keeps proxies from closing a quiet stream."""
    settings = request.app.state.settings
    loop = asyncio.get_running_loop()
    deadline, quiet_since = loop.time() + settings.gateway_follow_max_s, loop.time()
    while loop.time() < deadline and not await request.is_disconnected():
        async with request.app.state.pool.acquire() as conn:
            events = await history.job_history(conn, job_id, after)
        for event in events:
            yield core.sse(event)
            after = event["version"]
            if event["type"] in core.LAST_EVENT_TYPES:
                return
        if events:
            quiet_since = loop.time()
        elif loop.time() - quiet_since > 15:
            yield b": still following\n\n"
            quiet_since = loop.time()
        await asyncio.sleep(settings.gateway_follow_poll_s)


@router.get("/v1/queue", openapi_extra=acts(Action.QUEUE_READ))
async def queue(request: Request, principal: Caller, tenant: str | None = None) -> dict[str, Any]:
    within_rate(request, principal, "read")
    scoped = allowed(principal, Action.QUEUE_READ, Resource.in_tenant(tenant))
    sees_jobs = authorize(principal, Action.JOB_LIST, Resource.in_tenant(scoped)).allowed
    async with request.app.state.pool.acquire() as conn:
        waiting = await store.waiting_jobs(conn, scoped, datetime.now(UTC))
        shapes = await dashboard.waiting_shapes(conn, [w["job_id"] for w in waiting]) if sees_jobs else {}
    # what it asks for, as the queue it waits in stores it, and which of quota or capacity it waits for
    jobs = [{**w, **shapes.get(w["job_id"], {}), "blocked_by": blocked_by(w)} for w in waiting]
    return {"tenant": scoped, "jobs": [core.queue_view(j, sees_jobs) for j in jobs]}


def blocked_by(entry: dict[str, Any]) -> str:
    """``quota``: it waits in a cohort's quota queue; ``capacity``: it holds quota and waits for GPUs (the
    queue each is in says which, from placement's or quota's table)."""
    return "quota" if entry["queue"].startswith("quota") else "capacity"


@router.get("/v1/tenants", openapi_extra=acts(Action.TENANTS_READ))
async def tenants(request: Request, principal: Caller, tenant: str | None = None) -> dict[str, Any]:
    within_rate(request, principal, "read")
    scoped = allowed(principal, Action.TENANTS_READ, Resource.in_tenant(tenant))
    now = datetime.now(UTC)
    async with request.app.state.pool.acquire() as conn:
        usage = await usage_by_flavor(conn, scoped)
        tenancy = await request.app.state.tenancy.current(conn, now)
        pending = await dashboard.pending_rows(conn, scoped)
        names = {u["tenant"] for u in usage} | {p.tenant for p in pending} | set(tenancy.tenants if tenancy else ())
        decayed = await load_history(conn, tuple(sorted(names if scoped is None else names & {scoped})))
    # each tenant's cohort, weight, fair share and decayed usage, pending work and flavors; each cohort's totals
    view = plan_tenants(tenancy, usage, decayed, pending, now.timestamp(), scoped)
    return {"tenant": scoped, "revision": tenancy.revision if tenancy is not None else None, "usage": [
        {**u, "borrowed_units": core.borrowed_units(u["reserved_units"], u["nominal_units"])} for u in usage], **view}


@router.get("/v1/nodes", openapi_extra=acts(Action.NODES_READ))
async def nodes(request: Request, principal: Caller) -> dict[str, Any]:
    within_rate(request, principal, "read")
    allowed(principal, Action.NODES_READ, Resource.cluster())
    async with request.app.state.pool.acquire() as conn:
        return {"nodes": [{**n, "state": core.node_state(n)} for n in await node_inventory(conn)]}
