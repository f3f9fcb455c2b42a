"""The dashboard's read routes (issue 17), each as small as the others: authenticate, authorize through one
``gpusched_core.access`` decision, load (``gpusched_common.stores.dashboard``: a few queries over the whole
cluster), answer with a document a pure core builds (``gpusched_core.dashboard``).

- ``GET /v1/cluster`` (``nodes.read``): every node and GPU with its state, allocations and latest telemetry;
  per model totals; fragmentation; how many jobs of the common shapes fit now.
- ``GET /v1/history`` (``history.read``): usage series, submit->placed waits and preemptions over a window,
  narrowed to the caller's tenant where its role sees only that.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from gpusched_common.stores import dashboard
from gpusched_core.access import Action, Resource
from gpusched_core.dashboard import NodeRow, WindowError, plan_cluster, plan_history, plan_window
from gpusched_core.metrics.views import BUSY_THRESHOLD_PCT

from services.gateway import core
from services.gateway.auth import Caller, Problem, acts, allowed, within_rate

router = APIRouter()


@router.get("/v1/cluster", openapi_extra=acts(Action.NODES_READ))
async def cluster(request: Request, principal: Caller) -> dict[str, Any]:
    """Nodes (state as in /v1/nodes), their GPUs (free, busy, idle, cordoned or unhealthy; allocated milli;
    utilisation from the metrics service's latest reading), totals per model, fragmentation and fits."""
    within_rate(request, principal, "read")
    allowed(principal, Action.NODES_READ, Resource.cluster())
    async with request.app.state.pool.acquire() as conn:
        nodes, gpus, allocations, telemetry = await dashboard.cluster_rows(conn)
    rows = [NodeRow(n["node_id"], n["hostname"], core.node_state(n)) for n in nodes]
    return plan_cluster(rows, gpus, allocations, telemetry, datetime.now(UTC), busy_pct=BUSY_THRESHOLD_PCT)


@router.get("/v1/history", openapi_extra=acts(Action.HISTORY_READ))
async def history(request: Request, principal: Caller, since: datetime | None = None, until: datetime | None = None,
                  step_s: Annotated[int | None, Query(ge=1)] = None, tenant: str | None = None) -> dict[str, Any]:
    """``since``/``until`` ISO 8601 with a zone (default: the last 24 hours), ``step_s`` the bucket
    (default: at most ~300 buckets; more than 2,000 is 400), ``tenant`` (the caller's own unless it may see
    others)."""
    within_rate(request, principal, "read")
    scoped = allowed(principal, Action.HISTORY_READ, Resource.in_tenant(tenant))
    try:
        window = plan_window(datetime.now(UTC), since, until, step_s)
    except WindowError as exc:
        raise Problem(400, str(exc)) from None
    async with request.app.state.pool.acquire() as conn:
        usage = await dashboard.usage_rows(conn, window.since, window.until, scoped)
        instants = await dashboard.sampling_instants(conn, window.since, window.until)
        waits = await dashboard.placement_waits(conn, window.since, window.until, scoped)
        preempted = await dashboard.preemptions(conn, window.since, window.until, scoped)
    return plan_history(window, scoped, usage, instants, waits, preempted)
