"""GET /v1/queue/estimates: when each waiting job should start (Slurm's ``squeue --start``), from a forward
simulation of the whole queue (``gpusched_core.estimates``) over what ``stores.estimates`` reads. Authorized
as GET /v1/queue: action ``queue.read`` on the tenant; job details (tenant, queue, run-time, the run whose
end lets it start) only for a principal that may list that tenant's jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request

from gpusched_common.stores.estimates import load_estimate_inputs
from gpusched_core.access import Action, Resource, authorize
from gpusched_core.estimates import Estimate, EstimateConfig, plan_estimates

from services.gateway.auth import Caller, acts, allowed, within_rate

router = APIRouter()
CONFIG = EstimateConfig()


@router.get("/v1/queue/estimates", openapi_extra=acts(Action.QUEUE_READ))
async def queue_estimates(request: Request, principal: Caller, tenant: str | None = None) -> dict[str, Any]:
    within_rate(request, principal, "read")
    scoped = allowed(principal, Action.QUEUE_READ, Resource.in_tenant(tenant))
    sees_jobs = authorize(principal, Action.JOB_LIST, Resource.in_tenant(scoped)).allowed
    now = datetime.now(UTC)
    async with request.app.state.pool.acquire() as conn:
        inputs = await load_estimate_inputs(conn, now, CONFIG.history_s)
        tenancy = await request.app.state.tenancy.current(conn, now)
    estimates = plan_estimates(inputs.nodes, inputs.running, inputs.waiting, inputs.finished, now.timestamp(),
                               tenancy, CONFIG)
    tenant_of = {w.row["job_id"]: w.row["tenant"] for w in inputs.queue} | {r.job_id: r.tenant for r in inputs.running}
    jobs = []
    for entry, estimate in zip(inputs.queue, estimates, strict=True):
        if scoped is not None and entry.row["tenant"] != scoped:
            continue
        view = estimate_view(estimate, now)
        if sees_jobs:
            after = estimate.after_job
            view |= {"tenant": entry.row["tenant"], "queue": entry.queue, "runtime_s": estimate.runtime_s,
                     "after_job": after if after and (scoped is None or tenant_of.get(after) == scoped) else None}
        jobs.append(view)
    return {"tenant": scoped, "as_of": now.isoformat(), "jobs": jobs}


def estimate_view(estimate: Estimate, now: datetime) -> dict[str, Any]:
    """What any reader of the queue sees of one estimate."""
    start = None if estimate.wait_s is None else (now + timedelta(seconds=estimate.wait_s)).isoformat()
    return {"job_id": estimate.job_id, "position": estimate.position, "estimated_start": start,
            "estimated_wait_s": estimate.wait_s, "runtime_source": estimate.runtime_source,
            "reason": estimate.reason}
