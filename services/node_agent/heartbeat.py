"""Registration, heartbeats and the node lease, carried out for gpusched_core.agent.lease.

A heartbeat the broker accepted renews the lease; when none was accepted for the lease's ttl the agent
fences: it stops every job (placement may already requeue them elsewhere). The next accepted heartbeat
takes a new lease epoch and registers again, so reports of the old epoch are told apart.
"""

from __future__ import annotations

import asyncio
import logging

from gpusched_common import events as ev
from gpusched_core.agent import lease as leases
from gpusched_core.agent.labels import discovered_labels, node_labels
from gpusched_core.agent.reconcile import plan_reconcile

from services.node_agent.context import AgentContext
from services.node_agent import watchdog
from services.node_agent.exits import JobExits
log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self, ctx: AgentContext, exits: JobExits) -> None:
        self._ctx = ctx
        self._exits = exits

    def register(self) -> None:
        ctx = self._ctx
        info = ctx.backend.node_info()
        unhealthy = set(ctx.unhealthy_gpus())
        gpus = [g.model_copy(update={"healthy": g.healthy and g.index not in unhealthy}) for g in info.gpus]
        ctx.reporter.in_order(ev.NodeRegistered(
            node_id=ctx.node_id, hostname=info.hostname, gpus=gpus, cpu_milli=info.cpu_milli,
            memory_mib=info.memory_mib, driver_version=info.driver_version,
            labels=node_labels(discovered_labels(info.gpus, info.driver_version, info.cuda_version), ctx.config.labels),
            cuda_version=info.cuda_version, nvml_backend=info.backend, lease_epoch=ctx.lease.epoch,
            running_jobs=ctx.runner.running_job_ids(), log_url=ctx.config.log_url,
            isolation=ctx.runner.isolation()))
        log.info("registering %s: %d GPU(s), %s, lease epoch %d", ctx.node_id, len(gpus), info.backend,
                 ctx.lease.epoch)

    async def beat_once(self) -> None:
        ctx, config = self._ctx, self._ctx.config
        sent_at = ctx.monotonic()
        beat = ev.NodeHeartbeat(node_id=ctx.node_id, running_jobs=sorted(self._exits.running),
                                lease_epoch=ctx.lease.epoch, lease_ttl_s=config.lease_ttl_s,
                                fence_grace_s=config.fence_grace_s, unhealthy_gpus=ctx.unhealthy_gpus())
        timeout = max(0.1, min(config.heartbeat_interval_s, config.lease_ttl_s / 3 or 5.0))
        # its own task, started a turn later: reports queued in order before it (an enrolment request, a
        # registration) go out first
        sending = asyncio.ensure_future(ctx.reporter.report(beat))
        try:
            async with asyncio.timeout(timeout):  # not wait_for: see gpusched_common.relay's _pump
                await sending
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat only matters through the lease
            log.warning("%s: heartbeat not accepted (%s)", ctx.node_id, exc)
            return
        if ctx.lease.fenced:  # contact is back: a new epoch, so reports of the old one are told apart
            ctx.lease = leases.acquire(ctx.runner.next_epoch(), ctx.lease.ttl_s, sent_at)
            log.warning("%s: contact is back; re-registering with lease epoch %d", ctx.node_id, ctx.lease.epoch)
            self.publish_lease()
            self.register()
            return
        ctx.lease = leases.renewed(ctx.lease, sent_at)
        self.publish_lease()

    def publish_lease(self) -> None:
        """Tell the node's watchdog until when its jobs may run (services/node_agent/watchdog.py)."""
        ctx = self._ctx
        watchdog.publish_lease(ctx.runner.work_dir, ctx.lease, ctx.config.fence_grace_s, ctx.monotonic())

    def declared_lost(self, told: ev.NodeLost) -> None:
        """Placement declared this node lost at ``told.lease_epoch`` (or refused that epoch as used before):
        its jobs run elsewhere now. Still at that epoch, the agent stops them and registers again under a new
        one, at least the store's ``next_epoch`` (an older notice: ignored)."""
        ctx = self._ctx
        if told.lease_epoch != ctx.lease.epoch:
            return
        log.error("%s: placement declared the node lost at lease epoch %d (%s); stopping its jobs and registering "
                  "again", ctx.node_id, told.lease_epoch, told.reason[:200])
        self._exits.apply(plan_reconcile(ctx.runner.observe(), None, lease_valid=False))
        ctx.lease = leases.acquire(ctx.runner.next_epoch(at_least=told.next_epoch or 0), ctx.lease.ttl_s,
                                   ctx.monotonic())
        self.publish_lease()
        self.register()

    async def check_lease(self) -> None:
        ctx = self._ctx
        ctx.lease, lost = leases.check(ctx.lease, ctx.monotonic())
        if lost:
            log.error("%s: lease epoch %d expired; stopping every job (fencing)", ctx.node_id, ctx.lease.epoch)
            self._exits.apply(plan_reconcile(ctx.runner.observe(), None, lease_valid=False))
