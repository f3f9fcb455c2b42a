"""Node agent: registers the node's GPUs, runs the jobs placed on it, reports starts, exits and NVML
telemetry. It never touches the database: everything it knows goes out as reports over Kafka."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime, timezone

from faststream.kafka import KafkaBroker

from gpusched_common import events as ev
from gpusched_common.messaging import Incoming, PoisonMessage, publish
from gpusched_common.runtime import Runtime, run_service
from gpusched_common.settings import Settings
from gpusched_common.topics import NODES_COMMANDS, NODES_REPORTS, NODES_TELEMETRY, agent_group
from gpusched_common.tracing import context_from_traceparent, current_traceparent, tracer

from services.node_agent.nvml import NvmlBackend, make_backend
from services.node_agent.runner import JobExit, JobRecord, JobRunner

SERVICE = "node-agent"
log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Agent:
    def __init__(self, node_id: str, broker: KafkaBroker, backend: NvmlBackend, runner: JobRunner,
                 settings: Settings) -> None:
        self.node_id = node_id
        self._broker = broker
        self._backend = backend
        self._runner = runner
        self._settings = settings
        self._waiters: set[asyncio.Task] = set()

    async def report(self, payload: ev.Payload, topic: str = NODES_REPORTS.name) -> None:
        envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{self.node_id}",
                                    occurred_at=utcnow(), producer=f"{SERVICE}/{self.node_id}",
                                    traceparent=current_traceparent())
        headers = {"event-type": payload.TYPE}
        if envelope.traceparent:
            headers["traceparent"] = envelope.traceparent
        await publish(self._broker, topic, self.node_id, envelope.model_dump_json().encode(), headers)

    async def register(self) -> None:
        info = self._backend.node_info()
        await self.report(ev.NodeRegistered(
            node_id=self.node_id, hostname=info.hostname, gpus=list(info.gpus), cpu_milli=info.cpu_milli,
            memory_mib=info.memory_mib, driver_version=info.driver_version, cuda_version=info.cuda_version,
            nvml_backend=info.backend))
        log.info("registered %s with %d GPU(s) (%s)", self.node_id, len(info.gpus), info.backend)

    async def on_command(self, message: Incoming) -> None:
        if message.key != self.node_id:
            return  # commands for other nodes share the topic
        try:
            envelope = ev.Envelope.model_validate_json(message.value)
            payload = ev.parse_payload(envelope)
        except ValueError as exc:
            raise PoisonMessage(f"unreadable command: {exc}") from exc
        if isinstance(payload, ev.StartJob):
            await self.start(payload)
        elif isinstance(payload, ev.StopJob):
            self._runner.stop(payload.job_id)

    async def start(self, command: ev.StartJob) -> None:
        if self._runner.known(command.job_id):
            return  # a redelivered StartJob: the job already ran or runs
        result = await self._runner.start(command.job_id, command.command, tuple(command.gpu_indices), command.env)
        if isinstance(result, JobExit):
            self._runner.mark_reported(command.job_id)
            await self.report(ev.JobExitReported(job_id=result.job_id, node_id=self.node_id,
                                                 exit_code=result.exit_code, runtime_s=0.0, error=result.error))
            return
        self._backend.set_busy(result.gpu_indices, True)
        await self.report(ev.JobStartReported(job_id=command.job_id, node_id=self.node_id, pid=result.pid,
                                              started_at=datetime.fromtimestamp(result.started_at_s, timezone.utc)))
        self._watch(result, current_traceparent())

    def _watch(self, record: JobRecord, traceparent: str | None) -> None:
        task = asyncio.create_task(self._wait_and_report(record, traceparent))
        self._waiters.add(task)
        task.add_done_callback(self._waiters.discard)

    async def _wait_and_report(self, record: JobRecord, traceparent: str | None) -> None:
        result = await self._runner.wait(record)
        self._backend.set_busy(record.gpu_indices, False)
        with tracer().start_as_current_span(f"{SERVICE} job exited", context=context_from_traceparent(traceparent),
                                            attributes={"gpusched.job_id": record.job_id,
                                                        "gpusched.exit_code": result.exit_code}):
            payload = ev.JobExitReported(job_id=record.job_id, node_id=self.node_id, exit_code=result.exit_code,
                                         runtime_s=round(result.runtime_s, 3))
            delay = 0.5
            while True:
                try:
                    await self.report(payload)
                    break
                except Exception as exc:  # noqa: BLE001 - keep the exit until the broker takes it
                    log.warning("could not report exit of %s (%s); retrying", record.job_id, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        self._runner.mark_reported(record.job_id)

    def adopt(self) -> None:
        """After a restart: keep watching jobs that still run or finished unreported."""
        for record in self._runner.unreported():
            self._backend.set_busy(record.gpu_indices, True)
            self._watch(record, None)
            log.info("adopted job %s (pid %d)", record.job_id, record.pid)

    async def heartbeat_loop(self) -> None:
        while True:
            await self.report(ev.NodeHeartbeat(node_id=self.node_id, running_jobs=self._runner.running_job_ids()))
            await asyncio.sleep(self._settings.heartbeat_interval_s)

    async def telemetry_loop(self) -> None:
        while True:
            await self.report(ev.GpuTelemetry(node_id=self.node_id, sampled_at=utcnow(),
                                              samples=self._backend.sample()), topic=NODES_TELEMETRY.name)
            await asyncio.sleep(self._settings.telemetry_interval_s)


async def main(settings: Settings | None = None) -> None:
    settings = settings or Settings()
    node_id = settings.node_id
    backend = make_backend(settings.nvml_backend, node_id, settings.simulated_gpus)
    runner = JobRunner(settings.agent_work_dir / node_id)

    async def setup(runtime: Runtime) -> None:
        agent = Agent(node_id, runtime.broker, backend, runner, settings)
        runtime.subscribe(NODES_COMMANDS.name, agent_group(node_id), agent.on_command)

        async def lifecycle() -> None:
            await agent.register()
            agent.adopt()
            await asyncio.gather(agent.heartbeat_loop(), agent.telemetry_loop())

        runtime.background.append(lifecycle)

    try:
        await run_service(f"{SERVICE}-{node_id}", settings, setup, uses_database=False)
    finally:
        backend.close()
