"""The node agent's shell: runs the jobs placed on its node, reports starts, exits, heartbeats with a
lease, GPU health and NVML telemetry. Decisions come from the pure cores (gpusched_core.agent: starts,
stops, reconcile, lease; and health, shares); the parts wired here only observe, call them and act:

- commands.py: StartJob, StopJob, PreemptJob, ReconcileJobs
- exits.py: watching jobs until they end, stopping them, reporting each end (and checkpoints.py)
- heartbeat.py: registration, heartbeats, the lease and fencing
- health_monitor.py: GPU health and the fault policy; telemetry.py: NVML samples

It never touches the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gpusched_common import events as ev
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.topics import NODES_REPORTS
from gpusched_core.agent import lease as leases
from gpusched_core.agent import reconcile as rc
from gpusched_core.agent import retention
from gpusched_core.agent.lease import Lease

from services.node_agent.checkpoints import Checkpoints
from services.node_agent.commands import Commands
from services.node_agent.config import AgentConfig
from services.node_agent.context import AgentContext
from services.node_agent.exits import JobExits
from services.node_agent.faults import partitioned
from services.node_agent.health import GpuHealth
from services.node_agent.health_monitor import HealthMonitor
from services.node_agent.heartbeat import Heartbeat
from services.node_agent.identity import NodeIdentity
from services.node_agent.nvml import NvmlBackend
from services.node_agent.reporter import Reporter, Send
from services.node_agent.runner import JobRunner
from services.node_agent.telemetry import Telemetry

CHECKPOINT_POLL_S = 1.0
LOG_PRUNE_S = 600.0  # how often ended jobs' output past its retention is deleted
log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: AgentConfig, send: Send, backend: NvmlBackend, runner: JobRunner,
                 monotonic: Callable[[], float] = time.monotonic, identity: NodeIdentity | None = None) -> None:
        self.config = config
        self.node_id = config.node_id
        self.identity = identity if identity is not None else NodeIdentity(config.node_id, None, runner.work_dir)
        self.backend = backend
        self.runner = runner
        self._manual_partition = False
        started_at = monotonic()
        self.ctx = AgentContext(config, backend, runner, Reporter(config.node_id, send, self.partitioned,
                                                                   self.identity.signer),
                                monotonic, started_at, leases.acquire(0, config.lease_ttl_s, started_at))
        self.checkpoints = Checkpoints(self.ctx)
        self.exits = JobExits(self.ctx, self.checkpoints)
        self.commands = Commands(self.ctx, self.exits)
        self.heartbeat = Heartbeat(self.ctx, self.exits)
        self.health_monitor = HealthMonitor(self.ctx, self.exits)
        self.telemetry = Telemetry(self.ctx, self.exits.running)

    @property
    def lease(self) -> Lease:
        return self.ctx.lease

    @property
    def health(self) -> dict[int, GpuHealth]:
        return self.ctx.health

    # --- reports ------------------------------------------------------------------------------------

    def partitioned(self) -> bool:
        return self._manual_partition or partitioned(self.config.faults, self.ctx.elapsed_s())

    def set_partitioned(self, value: bool) -> None:
        """Simulate a network partition (tests and demos): every publish fails while it lasts."""
        self._manual_partition = value

    async def report(self, payload: ev.Payload, topic: str = NODES_REPORTS.name) -> None:
        await self.ctx.reporter.report(payload, topic)

    def report_in_order(self, payload: ev.Payload, on_sent: Callable[[], None] | None = None) -> None:
        self.ctx.reporter.in_order(payload, on_sent)

    async def flush(self) -> None:
        """Wait until every queued report was sent."""
        await self.ctx.reporter.flush()

    # --- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take a new lease epoch, register, adopt what still runs from the last life; wait until sent."""
        self.ctx.lease = leases.acquire(self.runner.next_epoch(), self.config.lease_ttl_s, self.ctx.monotonic())
        self.heartbeat.publish_lease()
        if self.identity.request is not None:  # first, on the partition its reports share: enrolled before read
            self.report_in_order(self.identity.request)
        self.register()
        self.apply(rc.plan_reconcile(self.runner.observe(), None))
        swept = self.runner.sweep_cgroups()
        if swept:
            log.info("%s: removed %d cgroup(s) of jobs that ended while no agent watched them", self.node_id, swept)
        await self.flush()

    def register(self) -> None:
        self.heartbeat.register()

    async def run(self) -> None:
        await self.start()
        await asyncio.gather(self._every(self.config.heartbeat_interval_s, self.heartbeat_once),
                             self._every(self.config.telemetry_interval_s, self.telemetry_once),
                             self._every(self.config.health_interval_s, self.health_once),
                             self._every(min(1.0, max(0.05, self.config.lease_ttl_s / 4)), self.check_lease),
                             self._every(CHECKPOINT_POLL_S, self.checkpoints_once),
                             self._every(min(LOG_PRUNE_S, self.config.log_retention_s), self.prune_logs_once))

    @staticmethod
    async def _every(interval_s: float, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a failed tick must not end the loop
                log.exception("agent step %s failed", getattr(step, "__name__", step))
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        await self.ctx.cancel_tasks()
        await self.ctx.reporter.close()

    # --- the parts' entry points (the loops above, the command consumer, tests) -------------------------

    async def on_command(self, message: Incoming) -> None:
        if message.key != self.node_id:
            return  # commands for other nodes share the topic
        _, notice = parse_event(message)  # parsed once: the commands' part reads the same result
        if isinstance(notice, (ev.NodeEnrolled, ev.NodeEnrolmentRefused)):
            self.identity.on_answer(notice, self.ctx.monotonic())
            return
        if isinstance(notice, ev.NodeLost):
            if notice.node_id == self.node_id:
                self.heartbeat.declared_lost(notice)
            return
        await self.commands.on_command(message)

    async def start_job(self, command: ev.StartJob) -> None:
        await self.commands.start_job(command)

    def preempt(self, command: ev.PreemptJob) -> None:
        self.commands.preempt(command)

    def apply(self, actions: tuple[rc.Action, ...]) -> None:
        self.exits.apply(actions)

    async def heartbeat_once(self) -> None:
        if self.identity.ask_again(self.ctx.monotonic()):  # refused before: the request, then the registration
            log.info("%s: asking placement again to enrol key %s", self.node_id, self.identity.request.key_id)
            self.report_in_order(self.identity.request)
            self.register()  # refused with the request (its key was unknown): registered again, in order
        await self.heartbeat.beat_once()

    async def check_lease(self) -> None:
        await self.heartbeat.check_lease()

    async def health_once(self) -> None:
        await self.health_monitor.check_once()

    async def telemetry_once(self) -> None:
        await self.telemetry.sample_once()

    async def prune_logs_once(self) -> None:
        """Delete the output of jobs that ended here longer ago than the retention (``log_retention_s``)."""
        for job_id in retention.expired(self.runner.kept_logs(), time.time(), self.config.log_retention_s):
            self.runner.forget_output(job_id)
            log.info("deleted the output of job %s: kept %.0f s after its last write", job_id,
                     self.config.log_retention_s)

    async def checkpoints_once(self) -> None:
        """Report each running job's new checkpoint reference (what it wrote to $GPUSCHED_CHECKPOINT_FILE)."""
        self.checkpoints.report_new(self.exits.running)
