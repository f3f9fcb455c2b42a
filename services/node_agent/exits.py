"""Watching the node's jobs until they end, stopping them, and reporting each end once.

An exit is reported in order with the other reports that must not be lost, and the job is marked
reported only once the broker took the report, so a restarted agent reports what its predecessor could
not (see gpusched_core.agent.reconcile, whose plans `apply` carries out). A job stopped because the store
no longer expects it here ends unreported: nobody waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpusched_common import events as ev
from gpusched_common.tracing import context_from_traceparent, tracer

from gpusched_core.agent import reconcile as rc
from gpusched_core.agent.stops import stop_error

from services.node_agent.checkpoints import Checkpoints
from services.node_agent.context import AgentContext
from services.node_agent.reporter import SERVICE
from services.node_agent.runner import JobRecord

log = logging.getLogger(__name__)


class JobExits:
    def __init__(self, ctx: AgentContext, checkpoints: Checkpoints) -> None:
        self._ctx = ctx
        self._checkpoints = checkpoints
        self.running: dict[str, JobRecord] = {}  # watched jobs
        self._stop_reasons: dict[str, str] = {}
        self.on_run_over: Callable[[str], None] | None = None  # told when a run's end was reported (job id)

    def stopping(self, job_id: str) -> bool:
        return job_id in self._stop_reasons

    def watch(self, record: JobRecord, traceparent: str | None) -> None:
        self.running[record.job_id] = record
        self._ctx.spawn(self._wait_and_report(record, traceparent), f"watch-{record.job_id}")
        if record.time_limit_s is not None:
            self._ctx.spawn(self._enforce_limit(record), f"limit-{record.job_id}")

    async def _enforce_limit(self, record: JobRecord) -> None:
        """Stop the run when its time limit is reached (counted from its start: an adopted job keeps it)."""
        assert record.time_limit_s is not None
        await asyncio.sleep(max(0.0, record.started_at_s + record.time_limit_s - time.time()))
        if self.running.get(record.job_id) is record:
            log.info("%s: job %s reached its time limit of %.0fs", self._ctx.node_id, record.job_id,
                     record.time_limit_s)
            self.stop(record.job_id, ev.ExitReason.TIME_LIMIT)

    def stop(self, job_id: str, reason_code: str, grace_s: float | None = None) -> None:
        """Stop the job (SIGTERM, SIGKILL after `grace_s`, by default half the fencing grace); its exit is
        reported with the first reason it was stopped for, by this agent or one before it (kept beside its
        record: ``JobRunner.note_stop``)."""
        self._stop_reasons.setdefault(job_id, self._ctx.runner.stop_reason(job_id) or reason_code)  # the first
        self._ctx.runner.note_stop(job_id, reason_code)
        if job_id not in self.running:
            record = self._ctx.runner.record(job_id)
            if record is not None:  # not watched (e.g. found at restart): watch it so its end is handled
                self.watch(record, None)
        grace_s = self._ctx.config.fence_grace_s / 2 if grace_s is None else grace_s
        self._ctx.spawn(self._ctx.runner.stop(job_id, grace_s=grace_s), f"stop-{job_id}")

    def report_exit(self, payload: ev.JobExitReported) -> None:
        report = payload.model_dump_json()
        # marked once the broker took it, and only on the run it is about: a report of an earlier run taken
        # late (after the job was placed here again and started) must not mark the new run reported
        self._ctx.reporter.in_order(payload, lambda: self._mark_reported(payload.job_id, report, payload.attempt))

    def _mark_reported(self, job_id: str, report: str = "", attempt: int | None = None) -> None:
        if self._ctx.runner.mark_reported(job_id, report, attempt) and self.on_run_over is not None:
            self.on_run_over(job_id)

    def apply(self, actions: tuple[rc.Action, ...]) -> None:
        """Carry out a reconcile plan."""
        ctx = self._ctx
        for action in actions:
            match action:
                case rc.Adopt(job_id=job_id):
                    record = ctx.runner.record(job_id)
                    if record is not None and job_id not in self.running:
                        ctx.backend.attach(job_id, record.gpu_indices, record.pid, record.share_milli,
                                           record.memory_mib)
                        self.watch(record, None)
                        log.info("%s: adopted job %s (pid %d)", ctx.node_id, job_id, record.pid)
                case rc.Stop(job_id=job_id, reason_code=code):
                    self.stop(job_id, code)
                case rc.ReportExit(job_id=job_id, exit_code=code, reason_code=reason):
                    record = ctx.runner.record(job_id)
                    if record is None:
                        continue
                    self.report_exit(self._exit_report(record, code, max(0.0, time.time() - record.started_at_s),
                                                       reason))
                case rc.ResendExit(job_id=job_id):
                    self._resend_exit(job_id)
                case rc.Forget(job_id=job_id):
                    self._mark_reported(job_id)
                case rc.ReportMissing(job_id=job_id):
                    ctx.reporter.in_order(ev.JobExitReported(
                        job_id=job_id, node_id=ctx.node_id, exit_code=137, runtime_s=0.0,
                        error=f"job was not running on {ctx.node_id} when the agent reconciled",
                        lease_epoch=ctx.lease.epoch, reason_code=ev.ExitReason.MISSING_AFTER_RESTART))

    def _resend_exit(self, job_id: str) -> None:
        """The store still expects a job whose end this agent reported: that report was lost (a broker that
        lost its data); send the same report again (placement takes a report of a run it has ended as
        nothing new)."""
        kept = self._ctx.runner.reported_exit(job_id)
        try:
            payload = ev.JobExitReported.model_validate_json(kept) if kept else None
        except ValueError:
            payload = None
        if payload is None:  # reported by an agent that kept no report: its code, if it left one
            record = self._ctx.runner.record(job_id)
            observed = next((o for o in self._ctx.runner.observe() if o.job_id == job_id), None)
            code = observed.exit_code if observed and observed.exit_code is not None else 137
            if record is None:
                payload = ev.JobExitReported(job_id=job_id, node_id=self._ctx.node_id, exit_code=code, runtime_s=0.0)
            else:  # with the reason an agent stopped it for, as its first report would have had
                payload = self._exit_report(record, code, 0.0, self._ctx.runner.stop_reason(job_id))
        log.warning("%s: the store still expects job %s, whose exit was reported: reporting it again",
                    self._ctx.node_id, job_id)
        self.report_exit(payload)

    async def _wait_and_report(self, record: JobRecord, traceparent: str | None) -> None:
        ctx = self._ctx
        try:
            result = await ctx.runner.wait(record)
        finally:
            self.running.pop(record.job_id, None)
        ctx.backend.detach(record.job_id)
        self._checkpoints.report(record.job_id)  # one written just before exiting is reported before the exit
        self._checkpoints.forget(record.job_id)
        reason = self._stop_reasons.pop(record.job_id, None) or ctx.runner.stop_reason(record.job_id)
        if reason == ev.ExitReason.NOT_ASSIGNED:
            self._mark_reported(record.job_id, attempt=record.attempt)
            return
        with tracer().start_as_current_span(f"{SERVICE} job exited", context=context_from_traceparent(traceparent),
                                            attributes={"gpusched.job_id": record.job_id,
                                                        "gpusched.exit_code": result.exit_code}):
            self.report_exit(self._exit_report(record, result.exit_code, result.runtime_s, reason))

    def _exit_report(self, record: JobRecord, exit_code: int, runtime_s: float,
                     reason: str | None) -> ev.JobExitReported:
        """The report of a run's end; ``reason``: the ExitReason the agent stopped it for, if it did."""
        ctx = self._ctx
        error = stop_error(reason, node_id=ctx.node_id, gpu_indices=record.gpu_indices,
                           lease_epoch=record.lease_epoch,
                           unhealthy_reasons={i: h.reasons for i, h in ctx.health.items() if not h.healthy},
                           time_limit_s=record.time_limit_s)
        return ev.JobExitReported(job_id=record.job_id, node_id=ctx.node_id, exit_code=exit_code,
                                  runtime_s=round(runtime_s, 3), lease_epoch=record.lease_epoch, reason_code=reason,
                                  error=error, attempt=record.attempt)
