"""Watching GPU health: inject the simulated faults that are due, assess NVML's signals (health.py),
report each status change and apply the GPU fault policy (gpusched_core.agent.stops) to the jobs on a
GPU that failed."""

from __future__ import annotations

import logging

from gpusched_common import events as ev
from gpusched_common.runtime import utcnow
from gpusched_common.events import ExitReason
from gpusched_core.agent.stops import decide_gpu_fault

from services.node_agent.context import AgentContext
from services.node_agent.exits import JobExits
from services.node_agent.faults import due_faults
from services.node_agent.health import HealthChange, plan_health

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(self, ctx: AgentContext, exits: JobExits) -> None:
        self._ctx = ctx
        self._exits = exits
        self._applied_faults: frozenset[int] = frozenset()

    async def check_once(self) -> None:
        ctx = self._ctx
        self._inject_due_faults()
        ctx.health, changes = plan_health(ctx.health, ctx.backend.health(), ctx.config.health_policy)
        for change in changes:
            self._on_change(change)

    def _inject_due_faults(self) -> None:
        ctx = self._ctx
        due = due_faults(ctx.config.faults, self._applied_faults, ctx.elapsed_s())
        for position in due:
            fault = ctx.config.faults[position]
            log.warning("%s: injecting fault %s", ctx.node_id, fault.describe())
            ctx.backend.inject(fault)
        self._applied_faults |= frozenset(due)

    def _on_change(self, change: HealthChange) -> None:
        ctx, gpu = self._ctx, change.after
        response = decide_gpu_fault(gpu_index=gpu.index, healthy=gpu.healthy, policy=ctx.config.gpu_fault_policy,
                                    job_gpus={job_id: r.gpu_indices for job_id, r in self._exits.running.items()})
        for job_id in response.to_stop:
            self._exits.stop(job_id, ExitReason.GPU_UNHEALTHY)
        log.warning("%s: GPU %d %s -> %s (%s)", ctx.node_id, gpu.index, change.before, gpu.status,
                    "; ".join(gpu.reasons) or "ok")
        # before the stopped jobs' exits, so placement cordons the GPU before it could reuse it
        ctx.reporter.in_order(ev.GpuHealthChanged(
            node_id=ctx.node_id, gpu_index=gpu.index, gpu_uuid=gpu.uuid, healthy=gpu.healthy, status=gpu.status,
            reasons=list(gpu.reasons), observed_at=utcnow(), lease_epoch=ctx.lease.epoch, xid=gpu.xid,
            job_ids=list(response.job_ids), job_action=response.job_action))
