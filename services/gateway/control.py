"""The gateway's control routes: ``POST /v1/jobs/{id}/cancel``, ``/hold``, ``/release``, and operators'
``POST /v1/nodes/{id}/cordon``, ``/uncordon``. The caller is judged by ``gpusched_core.access`` against the job's tenant and submitter (a user
cancels the jobs it submitted, a tenant admin its tenant's, an operator any; another tenant's job is 404);
the request goes to admission on ``gpusched.jobs.control``, signed as the gateway's producer and naming
the caller, and the job's lifecycle decides. A finished job is answered as it is, with no change."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from gpusched_common import events as ev
from gpusched_common.jobs import control_bytes
from gpusched_common.stores.cluster import node_cordon
from gpusched_common.topics import JOBS_CONTROL
from gpusched_common.tracing import current_traceparent
from gpusched_common.ids import is_valid_id
from gpusched_core.access import Action, Resource, authorize
from gpusched_core.lifecycle import TERMINAL

from services.gateway import store
from services.gateway.auth import Caller, Problem, acts, allowed, within_rate
from services.gateway.handlers import visible_job
from services.gateway.publisher import NotPublished

router = APIRouter()
FINISHED = frozenset(status.value for status in TERMINAL)


class CancelRequest(BaseModel):
    reason: str | None = Field(None, max_length=500, description="why; recorded with the cancellation")


@router.post("/v1/jobs/{job_id}/cancel", status_code=202, openapi_extra=acts(Action.JOB_CANCEL))
async def cancel_job(request: Request, principal: Caller, job_id: str,
                     body: CancelRequest | None = Body(None)) -> JSONResponse:
    """Cancel a job in any state: one waiting ends Cancelled; one running is stopped (SIGTERM, a grace,
    SIGKILL) and ends Cancelled once its agents report it gone. 202 when asked; 200 when it had ended.
    The id of a job array cancels each of its tasks the caller may cancel."""
    within_rate(request, principal, "submit")
    async with request.app.state.pool.acquire() as conn:
        tasks = await store.array_tasks(conn, job_id) if is_valid_id(job_id) and "." not in job_id and \
            await store.load_job(conn, job_id) is None else []
    if tasks:
        return await _cancel_array(request, principal, job_id, tasks, body)
    job = await _controlled(request, principal, Action.JOB_CANCEL, job_id, rated=False)
    if job["state"] in FINISHED:
        return JSONResponse({"job_id": job_id, "state": job["state"], "cancel": f"nothing to cancel: the job "
                             f"already {job['state']}"}, status_code=200)
    reason = (body.reason if body and body.reason else None) or f"cancelled by {principal.subject}"
    await _send(request, ev.CancelJob(job_id=job_id, reason=reason, requested_by=principal.subject), job_id,
                job["tenant"])
    body_out: dict[str, Any] = {"job_id": job_id, "state": job["state"], "cancel": "requested", "reason": reason}
    return JSONResponse(body_out, status_code=202)


async def _cancel_array(request: Request, principal: Caller, array_id: str, tasks: list[dict[str, Any]],
                        body: CancelRequest | None) -> JSONResponse:
    mine = [t for t in tasks if authorize(principal, Action.JOB_CANCEL,
                                          Resource.job(t["tenant"] or "", t["submitted_by"] or "")).allowed]
    if not mine:  # another tenant's array is as unknown as none
        raise Problem(404, f"no job {array_id}")
    reason = (body.reason if body and body.reason else None) or f"cancelled by {principal.subject}"
    running = [t for t in mine if t["state"] not in FINISHED]
    if running:
        await _send_all(request, [(t["job_id"], ev.CancelJob(job_id=t["job_id"], reason=reason,
                                                             requested_by=principal.subject), t["tenant"])
                                  for t in running])
    return JSONResponse({"job_id": array_id, "array_id": array_id, "cancel": "requested" if running else
                         "nothing to cancel: every task had ended", "tasks": len(mine), "requested": len(running),
                         "reason": reason}, status_code=202 if running else 200)


HOLDABLE = frozenset({"Admitted", "Queued"})


@router.post("/v1/jobs/{job_id}/hold", status_code=202, openapi_extra=acts(Action.JOB_HOLD))
async def hold_job(request: Request, principal: Caller, job_id: str,
                   body: CancelRequest | None = Body(None)) -> JSONResponse:
    """Set a waiting job aside: quota and placement leave it (a reservation is given back) until released.
    409 for a job that runs or ended; holding a held job changes nothing."""
    job = await _controlled(request, principal, Action.JOB_HOLD, job_id)
    if job["state"] == "Held":
        return JSONResponse({"job_id": job_id, "state": "Held", "hold": "held already"}, status_code=200)
    if job["state"] not in HOLDABLE:
        raise Problem(409, f"job {job_id} is {job['state']}: only a waiting job (Admitted or Queued) can be held")
    reason = (body.reason if body and body.reason else None) or f"held by {principal.subject}"
    await _send(request, ev.HoldJob(job_id=job_id, reason=reason, requested_by=principal.subject), job_id,
                job["tenant"])
    return JSONResponse({"job_id": job_id, "state": job["state"], "hold": "requested", "reason": reason},
                        status_code=202)


@router.post("/v1/jobs/{job_id}/release", status_code=202, openapi_extra=acts(Action.JOB_RELEASE))
async def release_job(request: Request, principal: Caller, job_id: str) -> JSONResponse:
    """Put a held job back in line at its original submission time; 409 for a job that is not held."""
    job = await _controlled(request, principal, Action.JOB_RELEASE, job_id)
    if job["state"] != "Held":
        raise Problem(409, f"job {job_id} is {job['state']}, not Held: there is nothing to release")
    await _send(request, ev.ReleaseJob(job_id=job_id, reason=f"released by {principal.subject}",
                                       requested_by=principal.subject), job_id, job["tenant"])
    return JSONResponse({"job_id": job_id, "state": "Held", "release": "requested"}, status_code=202)


async def _controlled(request: Request, principal: Caller, action: Action, job_id: str,
                      rated: bool = True) -> dict[str, Any]:
    if rated:  # (the caller took its token already otherwise)
        within_rate(request, principal, "submit")
    async with request.app.state.pool.acquire() as conn:
        return await visible_job(conn, principal, action, job_id)


async def _send(request: Request, payload: ev.CancelJob | ev.HoldJob | ev.ReleaseJob | ev.CordonNode, key: str,
                tenant: str | None = None) -> None:
    """Publish a control request on ``gpusched.jobs.control`` (keyed by its job or node), signed as the
    gateway's producer, and wait for the broker's ack; 503 when it did not take it."""
    await _send_all(request, [(key, payload, tenant)])


async def _send_all(request: Request, requests: list[tuple[str, ev.CancelJob | ev.HoldJob | ev.ReleaseJob |
                                                           ev.CordonNode, str | None]]) -> None:
    """Publish control requests of one type, (key, payload, tenant) each, in one go."""
    traceparent = current_traceparent()
    records = [(key, control_bytes(payload, tenant=tenant, traceparent=traceparent), None)
               for key, payload, tenant in requests]
    try:
        await request.app.state.publisher.publish(records, topic=JOBS_CONTROL.name, event_type=requests[0][1].TYPE)
    except NotPublished as exc:
        raise Problem(503, f"the request was not accepted: {exc}; retry", {"Retry-After": "1"}) from None


@router.post("/v1/nodes/{node_id}/cordon", status_code=202, openapi_extra=acts(Action.NODE_CORDON))
async def cordon_node(request: Request, principal: Caller, node_id: str,
                      body: CancelRequest | None = Body(None)) -> JSONResponse:
    """Operators: place no new work on the node (what runs there goes on); an event with who and why."""
    return await _node_control(request, principal, node_id, True, body)


@router.post("/v1/nodes/{node_id}/uncordon", status_code=202, openapi_extra=acts(Action.NODE_UNCORDON))
async def uncordon_node(request: Request, principal: Caller, node_id: str) -> JSONResponse:
    """Operators: place work on the node again."""
    return await _node_control(request, principal, node_id, False, None)


class DrainRequest(CancelRequest):
    grace_s: float = Field(600.0, gt=0, le=86400, description="how long each job may checkpoint before SIGKILL")


@router.post("/v1/nodes/{node_id}/drain", status_code=202, openapi_extra=acts(Action.NODE_DRAIN))
async def drain_node(request: Request, principal: Caller, node_id: str,
                     body: DrainRequest | None = Body(None)) -> JSONResponse:
    """Operators: cordon the node and preempt its jobs through the checkpoint protocol (each resumes on
    another node); ``gpusched nodes`` shows it Draining, then Drained once empty."""
    return await _node_control(request, principal, node_id, True, body, drain=body or DrainRequest())


async def _node_control(request: Request, principal: Caller, node_id: str, cordon: bool,
                        body: CancelRequest | None, drain: DrainRequest | None = None) -> JSONResponse:
    within_rate(request, principal, "submit")
    action = Action.NODE_DRAIN if drain else Action.NODE_CORDON if cordon else Action.NODE_UNCORDON
    allowed(principal, action, Resource.cluster())
    async with request.app.state.pool.acquire() as conn:
        node = await node_cordon(conn, node_id)
    if node is None:
        raise Problem(404, f"no node {node_id}")
    verb = "drain" if drain else "cordon" if cordon else "uncordon"
    done = node["drain_requested_at"] is not None if drain else (node["cordoned_at"] is not None) == cordon
    if done:
        return JSONResponse({"node_id": node_id, "cordoned": cordon, verb: f"{verb}ed already"}, status_code=200)
    reason = (body.reason if body and body.reason else None) or f"{verb}ed by {principal.subject}"
    payload = ev.CordonNode(node_id=node_id, cordon=cordon, reason=reason, requested_by=principal.subject,
                            drain_grace_s=drain.grace_s if drain else None)
    await _send(request, payload, node_id)
    return JSONResponse({"node_id": node_id, "cordoned": not cordon, verb: "requested", "reason": reason},
                        status_code=202)
