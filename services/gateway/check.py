"""``POST /v1/jobs:check``: would this job start now, after a preemption, wait, or never run here? The same
body as ``POST /v1/jobs`` (a JobSpec as JSON, or one workload as YAML), the same access rule
(``Action.JOB_SUBMIT``: a user checks only for its own tenant), read like a read (its rate, a bounded
body); the answer is ``gpusched_core.check``'s verdict on the cluster as the services that would decide it
load it, with the start-time estimator's answer for a job that would wait (what GET /v1/queue/estimates
reads, ``stores.estimates``), all read in one read-only snapshot. Nothing is submitted: no job, no event, nothing published."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
from fastapi import APIRouter, Request

from gpusched_common import events as ev
from gpusched_common.jobs import new_job_id
from gpusched_common.stores.cluster import load_cluster, pending_jobs
from gpusched_common.stores.estimates import load_estimate_inputs
from gpusched_common.stores.quota import blocked_work, load_cohort_queue, load_history, read_usage
from gpusched_common.stores.running import load_running
from gpusched_core import placement as engine
from gpusched_core import preemption as sel
from gpusched_core.access import Action, Resource
from gpusched_core.check import CheckInputs, check_submission
from gpusched_core.estimates import Forward
from gpusched_core.lifecycle import TERMINAL
from gpusched_core.quota.jobs import cohort_members, cohort_of

from services.gateway import core, store
from services.gateway.auth import Caller, Problem, acts, allowed, within_rate
from services.gateway.estimates import CONFIG as ESTIMATES
from services.gateway.submissions import LIMITS

router = APIRouter()
ENDED = frozenset(status.value for status in TERMINAL)


@router.post("/v1/jobs:check", openapi_extra={
    **acts(Action.JOB_SUBMIT),
    "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/JobSpec"}},
        "application/yaml": {"schema": {"type": "string", "description": "a Kubernetes workload"}}}}})
async def check_job(request: Request, principal: Caller) -> dict[str, Any]:
    """Evaluate a job against the live cluster without submitting it: ``verdict`` is ``start`` (with
    ``placement``), ``preempt`` (with ``victims``), ``wait`` or ``never``, with ``summary``, every reason
    and each stage's answer (admission, quota, placement, preemption)."""
    within_rate(request, principal, "read")
    try:
        kind, doc = core.job_document(request.headers.get("content-type"), await request.body())
        tenant = allowed(principal, Action.JOB_SUBMIT, Resource.in_tenant(core.named_tenant(kind, doc)))
        assert tenant is not None  # a submission, checked or not, is always for one tenant
        spec, _, warnings = core.build_job(kind, doc, tenant)
    except core.BadBody as exc:
        raise Problem(exc.status, str(exc), reasons=list(exc.reasons)) from None
    now = datetime.now(UTC)
    async with request.app.state.pool.acquire() as conn:
        async with conn.transaction(isolation="repeatable_read", readonly=True):  # one snapshot; writes nothing
            inputs = await _inputs(request, conn, spec, now)
    answer = check_submission(inputs).document()
    return {**answer, "warnings": list(warnings)} if warnings else answer


async def _inputs(request: Request, conn: asyncpg.Connection, spec: ev.JobSpec, now: datetime) -> CheckInputs:
    """What admission, quota, placement and preemption would read for this job, through their stores."""
    state, settings = request.app.state, request.app.state.settings
    tenancy = await state.tenancy.current(conn, now)
    models = await state.models.current(conn, now, tenancy.flavors if tenancy is not None else ())
    usage, history, queued, blocked = {}, {}, [], []
    if tenancy is not None:
        cohort = cohort_of(tenancy, spec.tenant)
        members = cohort_members(tenancy, cohort)
        usage, history = await read_usage(conn, members), await load_history(conn, members)
        queued = await load_cohort_queue(conn, tenancy, cohort)
        if settings.backfill_margin is not None:
            blocked = await blocked_work(conn, tenancy, members)
    nodes, snapshot = await load_cluster(conn)
    pending, _ = await pending_jobs(conn)
    after = sorted({d.job_id for d in spec.after})
    tenants, states = await store.job_tenants(conn, after), await store.job_states(conn, after)
    job_id = "check-" + new_job_id().removeprefix("j-")  # a name of its own in the reasons, no real job's
    estimator = await load_estimate_inputs(conn, now, ESTIMATES.history_s)  # what GET /v1/queue/estimates reads
    forward = Forward(estimator.nodes, estimator.running, estimator.waiting, estimator.finished, ESTIMATES)
    return CheckInputs(
        job_id, spec, now, _policy(request), limits=LIMITS, models=models, tenancy=tenancy, usage=usage,
        history=history, queued=queued, nodes=nodes, snapshot=snapshot, pending=pending,
        running=await load_running(conn),
        selection=sel.SelectionConfig(default_min_runtime_s=settings.preemption_min_runtime_s,
                                      cross_tenant=settings.preemption_cross_tenant),
        unknown_dependencies=tuple(j for j in after if tenants.get(j) != spec.tenant),
        waiting_on=tuple(j for j in after if tenants.get(j) == spec.tenant and states.get(j) not in ENDED),
        forward=forward, blocked=blocked, fair_margin=settings.backfill_margin)


def _policy(request: Request) -> engine.PlacementPolicy:
    """The placement policy the live placement service decides with (GPUSCHED_PLACEMENT_POLICY), built once."""
    policy = getattr(request.app.state, "check_policy", None)
    if policy is None:
        policy = request.app.state.check_policy = engine.make_policy(request.app.state.settings.placement_policy)
    return policy
