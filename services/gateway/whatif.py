"""POST /v1/whatif: the cluster's own history replayed under other placement policies or a tenancy (what
``gpusched whatif --json`` answers, computed here): the jobs submitted in the window and today's nodes, read
in one snapshot (``stores.whatif``), through the pure replay ``gpusched_core.whatif`` in a worker thread.

Action ``whatif.run`` (a view: an operator's replay covers every tenant, or the one it names; a tenant
admin's its tenant's jobs only). Bounded: at most ``gateway_whatif_max_jobs`` jobs in the window (else 422),
3 policies, one tenancy; ``gateway_whatif_timeout_s`` (else 504, and the replay is stopped); at most
``gateway_whatif_concurrency`` at once per process (else 503); it costs 100 of the principal's submission
budget."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpusched_common.stores.whatif import whatif_history
from gpusched_core.access import Action, Resource, never
from gpusched_core.durations import parse_duration
from gpusched_core.placement import policy_names
from gpusched_core.quota import Tenancy, TenancyError, load_tenancy
from gpusched_core.whatif import PreemptionSettings, Stopped, replay_jobs, replay_nodes, run_all

from services.gateway.auth import Caller, Problem, acts, allowed, within_rate

router = APIRouter()
PATH = "/v1/whatif"
COST = 100.0  # of the principal's submission budget: a replay is work, not a read
MAX_RUNS = 3
TENANCY_LABEL = "tenancy"  # runs under the posted tenancy are named policy@tenancy (the CLI: policy@file)


class WhatIfRequest(BaseModel):
    """``since``: a duration back from now (``7d``, ``12h``) or an ISO 8601 time with a zone; ``policies``:
    placement policies by name (1 to 3); ``tenancy_yaml``: a tenancy file's text to replay under (None: no
    quota); ``tenant``: an operator's narrowing to one tenant's jobs."""

    model_config = ConfigDict(extra="forbid")

    since: str = "7d"
    policies: list[str] = Field(default_factory=lambda: ["bestfit"], min_length=1, max_length=MAX_RUNS)
    tenancy_yaml: str | None = None
    tenant: str | None = None


SCHEMA = WhatIfRequest.model_json_schema()


@router.post(PATH, openapi_extra={**acts(Action.WHATIF_RUN), "requestBody": {
    "required": True, "content": {"application/json": {"schema": SCHEMA}}}})
async def run_whatif(request: Request, principal: Caller) -> dict[str, Any]:
    """Replay the jobs submitted since ``since`` once per policy: waits per tenant, JCT, GPU allocation,
    fragmentation, preemptions and GPU-hours lost, quota overshoot (``gpusched whatif --json``'s answer)."""
    within_rate(request, principal, "submit", cost=COST)
    if (refusal := never(principal, Action.WHATIF_RUN)) is not None:
        raise Problem(refusal.status, refusal.reason)
    body = _request(await request.body())
    scoped = allowed(principal, Action.WHATIF_RUN, Resource.in_tenant(body.tenant))
    settings = request.app.state.settings
    now = datetime.now(UTC)
    since = _since(body.since, now)
    policies = _policies(body.policies)
    tenancies = _tenancies(body.tenancy_yaml)
    most = settings.gateway_whatif_max_jobs
    async with request.app.state.pool.acquire() as conn:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            history = await whatif_history(conn, since, now, scoped, most)
    if history.over(most):
        raise Problem(422, f"{history.total} jobs were submitted since {since.isoformat()}: a what-if replays at most "
                           f"{most}; choose a shorter window", reasons=[f"at most {most} jobs in the window"])
    jobs, skipped = replay_jobs(history.jobs)
    nodes = replay_nodes(history.nodes)
    if not nodes:
        raise Problem(409, "no Ready node to replay on")
    preemption = PreemptionSettings(grace_s=settings.preemption_grace_s,
                                    min_runtime_s=settings.preemption_min_runtime_s,
                                    cross_tenant=settings.preemption_cross_tenant,
                                    fair_margin=settings.fair_share_margin, fair_backfill=settings.fair_backfill,
                                    fair_preemption=settings.fair_share_preemption,
                                    fair_quantum_s=settings.fair_share_quantum_s)
    runs = await _replay(request, jobs, nodes, policies, tenancies, preemption)
    return {"since": since.isoformat(), "jobs": len(jobs), "left_out": skipped, "nodes": len(nodes),
            "gpus": sum(n.gpus for n in nodes), "runs": runs}


async def _replay(request: Request, jobs, nodes, policies: list[str], tenancies: dict[str, Tenancy | None],
                  preemption: PreemptionSettings) -> dict[str, dict]:
    """``run_all`` in a worker thread, within the timeout (else 504, and the thread told to stop) and the
    process's bound on replays at once (else 503)."""
    state, settings = request.app.state, request.app.state.settings
    running = getattr(state, "whatif_running", 0)
    if running >= settings.gateway_whatif_concurrency:
        raise Problem(503, f"{running} what-if replay(s) are running in this gateway already; retry shortly",
                      {"Retry-After": "10"})
    state.whatif_running = running + 1
    stop = threading.Event()
    try:
        async with asyncio.timeout(settings.gateway_whatif_timeout_s):  # not wait_for: see relay._pump
            return await asyncio.to_thread(run_all, jobs, nodes, policies, tenancies, clock=time.perf_counter,
                                           preemption=preemption, stop=stop.is_set)
    except (TimeoutError, Stopped):
        stop.set()
        raise Problem(504, f"the what-if took longer than {settings.gateway_whatif_timeout_s:g} s: choose a "
                           f"shorter window or fewer policies") from None
    finally:
        state.whatif_running -= 1


def _request(raw: bytes) -> WhatIfRequest:
    try:
        doc = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Problem(400, f"the body is not valid JSON: {exc}", reasons=[str(exc)]) from None
    try:
        return WhatIfRequest.model_validate(doc)
    except ValidationError as exc:
        reasons = [f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()]
        raise Problem(422, "the body is no what-if request ({since, policies, tenancy_yaml, tenant})",
                      reasons=reasons) from None


def _since(text: str, now: datetime) -> datetime:
    """``7d`` back from now, or an ISO time with a zone, in the past."""
    try:
        since = now - timedelta(seconds=parse_duration(text))
    except ValueError:
        try:
            since = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            since = None
        if since is None or since.tzinfo is None:
            raise Problem(422, f"since: {text!r} is neither a duration (7d, 12h) nor an ISO 8601 time with a zone",
                          reasons=[f"since: {text!r}"]) from None
    if since >= now:
        raise Problem(422, f"since: {since.isoformat()} is not in the past", reasons=["since is not in the past"])
    return since


def _policies(names: list[str]) -> list[str]:
    policies = list(dict.fromkeys(n.strip() for n in names if n.strip()))
    unknown = [p for p in policies if p not in policy_names()]
    if unknown or not policies:
        raise Problem(422, f"unknown policies {unknown}; known: {', '.join(policy_names())}",
                      reasons=[f"unknown policy {p}" for p in unknown] or ["no policy"])
    return policies


def _tenancies(text: str | None) -> dict[str, Tenancy | None]:
    if text is None or not text.strip():
        return {"": None}
    try:
        return {TENANCY_LABEL: load_tenancy(text)}
    except TenancyError as exc:
        raise Problem(422, f"tenancy_yaml: {exc}", reasons=[str(exc)]) from None
