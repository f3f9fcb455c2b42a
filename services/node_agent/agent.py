"""The node agent's shell: runs the jobs placed on its node, reports starts, exits, heartbeats with a
lease, GPU health and NVML telemetry. Decisions come from the pure cores (reconcile, lease, health,
shares); this module only observes, calls them and acts. It never touches the database.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gpusched_common import events as ev
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.runtime import utcnow
from gpusched_common.settings import Settings
from gpusched_common.topics import NODES_REPORTS, NODES_TELEMETRY
from gpusched_common.tracing import context_from_traceparent, current_traceparent, tracer

from services.node_agent import lease as leases
from services.node_agent import reconcile as rc
from services.node_agent.faults import Fault, due_faults, parse_faults, partitioned
from services.node_agent.health import GpuHealth, HealthChange, HealthPolicy, parse_xids, plan_health
from services.node_agent.inventory import attribute_processes, parse_labels
from services.node_agent.nvml import NvmlBackend
from services.node_agent.reporter import SERVICE, Reporter, Send
from services.node_agent.runner import JobExit, JobRecord, JobRunner
from services.node_agent.shares import job_environment

GPU_UNHEALTHY, STOPPED, PREEMPTED = "gpu_unhealthy", "stopped", "preempted"
CHECKPOINT_POLL_S = 1.0
log = logging.getLogger(__name__)



@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    heartbeat_interval_s: float = 10.0
    telemetry_interval_s: float = 5.0
    health_interval_s: float = 2.0
    lease_ttl_s: float = 30.0
    fence_grace_s: float = 10.0
    gpu_fault_policy: str = "stop"
    health_policy: HealthPolicy = HealthPolicy()
    labels: dict[str, str] = field(default_factory=dict)
    mps_pipe_dir: Path | None = None
    faults: tuple[Fault, ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings, node_id: str) -> AgentConfig:
        return cls(node_id=node_id, heartbeat_interval_s=settings.heartbeat_interval_s,
                   telemetry_interval_s=settings.telemetry_interval_s, health_interval_s=settings.health_interval_s,
                   lease_ttl_s=settings.lease_ttl_s, fence_grace_s=settings.fence_grace_s,
                   gpu_fault_policy=settings.gpu_fault_policy,
                   health_policy=HealthPolicy(ignored_xids=parse_xids(settings.health_ignored_xids)),
                   labels=parse_labels(settings.node_labels), mps_pipe_dir=settings.mps_pipe_dir,
                   faults=parse_faults(settings.simulated_faults))


class Agent:
    def __init__(self, config: AgentConfig, send: Send, backend: NvmlBackend, runner: JobRunner,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.node_id = config.node_id
        self.backend = backend
        self.runner = runner
        self._monotonic = monotonic
        self._started_at = monotonic()
        self.lease = leases.acquire(0, config.lease_ttl_s, self._started_at)
        self.health: dict[int, GpuHealth] = {}
        self._stop_reasons: dict[str, str] = {}
        self._running: dict[str, JobRecord] = {}  # watched jobs
        self._checkpoints: dict[str, str] = {}  # job -> last checkpoint reference reported
        self._tasks: set[asyncio.Task] = set()
        self._applied_faults: frozenset[int] = frozenset()
        self._manual_partition = False
        self._reporter = Reporter(config.node_id, send, self.partitioned)

    # --- reports ------------------------------------------------------------------------------------

    def partitioned(self) -> bool:
        return self._manual_partition or partitioned(self.config.faults, self._monotonic() - self._started_at)

    def set_partitioned(self, value: bool) -> None:
        """Simulate a network partition (tests and demos): every publish fails while it lasts."""
        self._manual_partition = value

    async def report(self, payload: ev.Payload, topic: str = NODES_REPORTS.name) -> None:
        await self._reporter.report(payload, topic)

    def report_in_order(self, payload: ev.Payload, on_sent: Callable[[], None] | None = None) -> None:
        self._reporter.in_order(payload, on_sent)

    async def flush(self) -> None:
        """Wait until every queued report was sent."""
        await self._reporter.flush()

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.node_id}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Take a new lease epoch, register, adopt what still runs from the last life; wait until sent."""
        self.lease = leases.acquire(self.runner.next_epoch(), self.config.lease_ttl_s, self._monotonic())
        self.register()
        self.apply(rc.plan_reconcile(self.runner.observe(), None))
        await self.flush()

    def register(self) -> None:
        info = self.backend.node_info()
        unhealthy = {i for i, h in self.health.items() if not h.healthy}
        gpus = [g.model_copy(update={"healthy": g.healthy and g.index not in unhealthy}) for g in info.gpus]
        self.report_in_order(ev.NodeRegistered(
            node_id=self.node_id, hostname=info.hostname, gpus=gpus, cpu_milli=info.cpu_milli,
            memory_mib=info.memory_mib, labels=dict(self.config.labels), driver_version=info.driver_version,
            cuda_version=info.cuda_version, nvml_backend=info.backend, lease_epoch=self.lease.epoch,
            running_jobs=self.runner.running_job_ids()))
        log.info("registering %s: %d GPU(s), %s, lease epoch %d", self.node_id, len(gpus), info.backend,
                 self.lease.epoch)

    async def run(self) -> None:
        await self.start()
        await asyncio.gather(self._every(self.config.heartbeat_interval_s, self.heartbeat_once),
                             self._every(self.config.telemetry_interval_s, self.telemetry_once),
                             self._every(self.config.health_interval_s, self.health_once),
                             self._every(min(1.0, max(0.05, self.config.lease_ttl_s / 4)), self.check_lease),
                             self._every(CHECKPOINT_POLL_S, self.checkpoints_once))

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
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._reporter.close()

    # --- reconcile ----------------------------------------------------------------------------------

    def apply(self, actions: tuple[rc.Action, ...]) -> None:
        for action in actions:
            match action:
                case rc.Adopt(job_id=job_id):
                    record = self.runner.record(job_id)
                    if record is not None and job_id not in self._running:
                        self.backend.attach(job_id, record.gpu_indices, record.pid, record.share_milli,
                                            record.memory_mib)
                        self._watch(record, None)
                        log.info("%s: adopted job %s (pid %d)", self.node_id, job_id, record.pid)
                case rc.Stop(job_id=job_id, reason_code=code):
                    self._stop(job_id, code)
                case rc.ReportExit(job_id=job_id, exit_code=code):
                    record = self.runner.record(job_id)
                    runtime = max(0.0, time.time() - record.started_at_s) if record else 0.0
                    self._report_exit(ev.JobExitReported(
                        job_id=job_id, node_id=self.node_id, exit_code=code, runtime_s=round(runtime, 3),
                        lease_epoch=record.lease_epoch if record else None))
                case rc.Forget(job_id=job_id):
                    self.runner.mark_reported(job_id)
                case rc.ReportMissing(job_id=job_id):
                    self.report_in_order(ev.JobExitReported(
                        job_id=job_id, node_id=self.node_id, exit_code=137, runtime_s=0.0,
                        error=f"job was not running on {self.node_id} when the agent reconciled",
                        lease_epoch=self.lease.epoch, reason_code=rc.MISSING))

    def _report_exit(self, payload: ev.JobExitReported) -> None:
        self.report_in_order(payload, lambda: self.runner.mark_reported(payload.job_id))

    def _stop(self, job_id: str, reason_code: str, grace_s: float | None = None) -> None:
        self._stop_reasons.setdefault(job_id, reason_code)
        if job_id not in self._running:
            record = self.runner.record(job_id)
            if record is not None:  # not watched (e.g. found at restart): watch it so its end is handled
                self._watch(record, None)
        grace_s = self.config.fence_grace_s / 2 if grace_s is None else grace_s
        self._spawn(self.runner.stop(job_id, grace_s=grace_s), f"stop-{job_id}")

    # --- commands -----------------------------------------------------------------------------------

    async def on_command(self, message: Incoming) -> None:
        if message.key != self.node_id:
            return  # commands for other nodes share the topic
        _, payload = parse_event(message)
        if isinstance(payload, ev.StartJob):
            await self.start_job(payload)
        elif isinstance(payload, ev.StopJob):
            if self.runner.known(payload.job_id):
                self._stop(payload.job_id, STOPPED)
        elif isinstance(payload, ev.PreemptJob):
            self.preempt(payload)
        elif isinstance(payload, ev.ReconcileJobs):
            if payload.lease_epoch is None or payload.lease_epoch == self.lease.epoch:
                self.apply(rc.plan_reconcile(self.runner.observe(), frozenset(payload.job_ids),
                                             lease_valid=self.lease.valid))

    async def start_job(self, command: ev.StartJob) -> None:
        if self.runner.known(command.job_id):
            previous = self.runner.record(command.job_id)
            if previous is None or command.attempt <= previous.attempt or not self.runner.reported(command.job_id):
                return  # a redelivered StartJob: this run already ran or runs
            self.runner.finish_run(command.job_id)  # a new run of a job that ran here before
        refusal = self._refusal(command)
        if refusal is not None:
            reason_code, error = refusal
            self.report_in_order(ev.JobExitReported(job_id=command.job_id, node_id=self.node_id, exit_code=137,
                                                    runtime_s=0.0, error=error, lease_epoch=self.lease.epoch,
                                                    reason_code=reason_code))
            return
        uuids = tuple(command.gpu_uuids)
        if command.mig_profile is not None:
            try:
                uuids = (self.backend.mig_device_for(command.job_id, command.gpu_indices[0], command.mig_profile,
                                                     command.mig_start or 0),)
            except ValueError as exc:
                error = f"MIG {command.mig_profile} on GPU {command.gpu_indices[0]} of {self.node_id}: {exc}"
                self.report_in_order(ev.JobExitReported(job_id=command.job_id, node_id=self.node_id, exit_code=137,
                                                        runtime_s=0.0, error=error, lease_epoch=self.lease.epoch))
                return
        job_env = job_environment(gpu_indices=tuple(command.gpu_indices), gpu_uuids=uuids,
                                  share_milli=command.gpu_share_milli, memory_mib=command.gpu_memory_mib,
                                  mps_pipe_dir=self._mps_dir())
        result = await self.runner.start(command.job_id, command.command, tuple(command.gpu_indices),
                                         {**command.env, **job_env.env, **mig_env(command)},
                                         lease_epoch=self.lease.epoch,
                                         share_milli=command.gpu_share_milli, memory_mib=command.gpu_memory_mib,
                                         attempt=command.attempt)
        if isinstance(result, JobExit):
            self.report_in_order(ev.JobExitReported(job_id=result.job_id, node_id=self.node_id,
                                                    exit_code=result.exit_code, runtime_s=0.0, error=result.error,
                                                    lease_epoch=self.lease.epoch))
            return
        self.backend.attach(command.job_id, result.gpu_indices, result.pid, command.gpu_share_milli,
                            command.gpu_memory_mib)
        # queued, not awaited: a redelivered StartJob finds the job known, so this report must not be lost
        self.report_in_order(ev.JobStartReported(job_id=command.job_id, node_id=self.node_id, pid=result.pid,
                                                 started_at=datetime.fromtimestamp(result.started_at_s, timezone.utc),
                                                 lease_epoch=self.lease.epoch, unenforced=list(job_env.unenforced)))
        self._watch(result, current_traceparent())

    def preempt(self, command: ev.PreemptJob) -> None:
        """Tell the job (SIGTERM and a notice file naming the deadline), SIGKILL it at the deadline."""
        if not self.runner.known(command.job_id) or self.runner.reported(command.job_id):
            return  # never started here, or already ended and reported: placement hears the exit anyway
        if command.job_id in self._stop_reasons:
            return  # a redelivered PreemptJob: the stop is under way
        self.runner.write_preempt_notice(command.job_id, command.deadline_at, command.reason)
        grace_s = max(0.0, (command.deadline_at - utcnow()).total_seconds())
        log.info("%s: preempting %s (%s); grace %.1fs", self.node_id, command.job_id, command.reason, grace_s)
        self._stop(command.job_id, PREEMPTED, grace_s=grace_s)

    async def checkpoints_once(self) -> None:
        """Report each running job's new checkpoint reference (what it wrote to $GPUSCHED_CHECKPOINT_FILE)."""
        for job_id in sorted(self._running):
            self._report_checkpoint(job_id)

    def _report_checkpoint(self, job_id: str) -> None:
        ref = self.runner.read_checkpoint(job_id)
        if ref is None or self._checkpoints.get(job_id) == ref:
            return
        self._checkpoints[job_id] = ref
        self.report_in_order(ev.JobCheckpointReported(job_id=job_id, node_id=self.node_id, checkpoint_ref=ref,
                                                      checkpointed_at=utcnow(), lease_epoch=self.lease.epoch))

    def _refusal(self, command: ev.StartJob) -> tuple[str, str] | None:
        if not self.lease.valid:
            return rc.LEASE_LOST, f"{self.node_id} has lost its lease; the job was not started"
        sick = [i for i in command.gpu_indices if i in self.health and not self.health[i].healthy]
        if sick:
            return GPU_UNHEALTHY, f"GPU(s) {sick} on {self.node_id} are unhealthy; the job was not started"
        return None

    def _mps_dir(self) -> Path | None:
        pipe = self.config.mps_pipe_dir
        return pipe if pipe is not None and (pipe / "control").exists() else None

    # --- job exits ----------------------------------------------------------------------------------

    def _watch(self, record: JobRecord, traceparent: str | None) -> None:
        self._running[record.job_id] = record
        self._spawn(self._wait_and_report(record, traceparent), f"watch-{record.job_id}")

    async def _wait_and_report(self, record: JobRecord, traceparent: str | None) -> None:
        try:
            result = await self.runner.wait(record)
        finally:
            self._running.pop(record.job_id, None)
        self.backend.detach(record.job_id)
        self._report_checkpoint(record.job_id)  # one written just before exiting is reported before the exit
        self._checkpoints.pop(record.job_id, None)
        reason = self._stop_reasons.pop(record.job_id, None)
        if reason == rc.NOT_ASSIGNED:
            self.runner.mark_reported(record.job_id)
            return
        with tracer().start_as_current_span(f"{SERVICE} job exited", context=context_from_traceparent(traceparent),
                                            attributes={"gpusched.job_id": record.job_id,
                                                        "gpusched.exit_code": result.exit_code}):
            self._report_exit(ev.JobExitReported(
                job_id=record.job_id, node_id=self.node_id, exit_code=result.exit_code,
                runtime_s=round(result.runtime_s, 3), lease_epoch=record.lease_epoch, reason_code=reason,
                error=self._stop_error(reason, record)))

    def _stop_error(self, reason: str | None, record: JobRecord) -> str | None:
        if reason == GPU_UNHEALTHY:
            sick = [f"GPU {i}: {'; '.join(self.health[i].reasons)}" for i in record.gpu_indices
                    if i in self.health and not self.health[i].healthy]
            return f"stopped by {self.node_id}: {', '.join(sick) or 'GPU unhealthy'}"
        if reason == rc.LEASE_LOST:
            return f"stopped by {self.node_id}: node lease (epoch {record.lease_epoch}) expired"
        return None

    # --- heartbeats and the lease -------------------------------------------------------------------

    async def heartbeat_once(self) -> None:
        sent_at = self._monotonic()
        beat = ev.NodeHeartbeat(node_id=self.node_id, running_jobs=sorted(self._running),
                                lease_epoch=self.lease.epoch, lease_ttl_s=self.config.lease_ttl_s,
                                fence_grace_s=self.config.fence_grace_s,
                                unhealthy_gpus=sorted(i for i, h in self.health.items() if not h.healthy))
        timeout = max(0.1, min(self.config.heartbeat_interval_s, self.config.lease_ttl_s / 3 or 5.0))
        try:
            await asyncio.wait_for(self.report(beat), timeout)
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat only matters through the lease
            log.warning("%s: heartbeat not accepted (%s)", self.node_id, exc)
            return
        if self.lease.fenced:  # contact is back: a new epoch, so reports of the old one are told apart
            self.lease = leases.acquire(self.runner.next_epoch(), self.lease.ttl_s, sent_at)
            log.warning("%s: contact is back; re-registering with lease epoch %d", self.node_id, self.lease.epoch)
            self.register()
            return
        self.lease = leases.renewed(self.lease, sent_at)

    async def check_lease(self) -> None:
        self.lease, lost = leases.check(self.lease, self._monotonic())
        if lost:
            log.error("%s: lease epoch %d expired; stopping every job (fencing)", self.node_id, self.lease.epoch)
            self.apply(rc.plan_reconcile(self.runner.observe(), None, lease_valid=False))

    # --- telemetry and health -----------------------------------------------------------------------

    async def telemetry_once(self) -> None:
        samples = self.backend.sample()
        samples = attribute_processes(samples, self._job_of_pid({p.pid for s in samples for p in s.processes}))
        try:
            await self.report(ev.GpuTelemetry(node_id=self.node_id, sampled_at=utcnow(), samples=samples),
                              topic=NODES_TELEMETRY.name)
        except Exception as exc:  # noqa: BLE001 - telemetry is lossy by design
            log.debug("%s: telemetry dropped (%s)", self.node_id, exc)

    def _job_of_pid(self, pids: set[int]) -> dict[int, str]:
        """NVML pids -> job ids: a job's processes share its session (the wrapper's pid)."""
        sessions = {r.pid: job_id for job_id, r in self._running.items()}
        mapping = {}
        for pid in pids:
            if pid in sessions:
                mapping[pid] = sessions[pid]
                continue
            try:
                sid = os.getsid(pid)
            except OSError:
                continue
            if sid in sessions:
                mapping[pid] = sessions[sid]
        return mapping

    async def health_once(self) -> None:
        self._inject_due_faults()
        self.health, changes = plan_health(self.health, self.backend.health(), self.config.health_policy)
        for change in changes:
            await self._on_health_change(change)

    def _inject_due_faults(self) -> None:
        due = due_faults(self.config.faults, self._applied_faults, self._monotonic() - self._started_at)
        for position in due:
            fault = self.config.faults[position]
            log.warning("%s: injecting fault %s", self.node_id, fault.describe())
            self.backend.inject(fault)
        self._applied_faults |= frozenset(due)

    async def _on_health_change(self, change: HealthChange) -> None:
        gpu = change.after
        jobs = sorted(job_id for job_id, r in self._running.items() if gpu.index in r.gpu_indices)
        action = None
        if jobs and not gpu.healthy:
            action = "stopped" if self.config.gpu_fault_policy == "stop" else "kept"
            if action == "stopped":
                for job_id in jobs:
                    self._stop(job_id, GPU_UNHEALTHY)
        log.warning("%s: GPU %d %s -> %s (%s)", self.node_id, gpu.index, change.before, gpu.status,
                    "; ".join(gpu.reasons) or "ok")
        # before the stopped jobs' exits, so placement cordons the GPU before it could reuse it
        self.report_in_order(ev.GpuHealthChanged(
            node_id=self.node_id, gpu_index=gpu.index, gpu_uuid=gpu.uuid, healthy=gpu.healthy, status=gpu.status,
            reasons=list(gpu.reasons), observed_at=utcnow(), lease_epoch=self.lease.epoch, xid=gpu.xid,
            job_ids=jobs, job_action=action))


def mig_env(command: ev.StartJob) -> dict[str, str]:
    if command.mig_profile is None:
        return {}
    return {"GPUSCHED_MIG_PROFILE": command.mig_profile, "GPUSCHED_MIG_START": str(command.mig_start or 0)}
