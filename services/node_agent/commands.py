"""The commands placement and preemption send a node (StartJob, StopJob, PreemptJob, ReconcileJobs),
decided by gpusched_core.agent and carried out here, one at a time.

A StartJob of a job's next run that arrives while this node's earlier run of it still stops (a gang
requeued, or a job preempted, and placed here again at once) waits for that run's end to be reported and
then starts; a StopJob or PreemptJob meanwhile reports it never started, and a ReconcileJobs settles it
(the store's list reports a wanted run that does not run as missing)."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from pathlib import Path

from gpusched_common import events as ev
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.job_records import BAD_RECORD
from gpusched_common.runtime import utcnow
from gpusched_common.tracing import current_traceparent
from gpusched_core.agent import reconcile as rc
from gpusched_common.events import ExitReason
from gpusched_core.agent.start import (
    DUPLICATE, OTHER_EPOCH, RUN_NOT_OVER, Ignore, NodeFacts, PreviousRun, Refuse, decide_start,
)
from gpusched_core.agent.seen import SeenCommands
from gpusched_core.agent.stops import Preempt, decide_preempt

from services.node_agent.context import AgentContext
from services.node_agent.exits import JobExits
from services.node_agent.runner import JobExit
from services.node_agent.cgroups import limits_for
from services.node_agent.shares import job_environment

log = logging.getLogger(__name__)

MAX_HELD_STARTS = 10_000  # StartJobs of an earlier epoch kept for the next ReconcileJobs


class Commands:
    def __init__(self, ctx: AgentContext, exits: JobExits) -> None:
        self._ctx = ctx
        self._exits = exits
        # StartJobs placed for an earlier lease epoch of this node (before the agent restarted or regained its
        # lease), or for the current one before the store confirmed it: run only if the ReconcileJobs of the
        # current epoch lists them, else dropped
        self._held: dict[str, ev.StartJob] = {}
        # the epoch the store confirmed (its ReconcileJobs answered the registration): an agent whose
        # directory was wiped counts from 1 again, and old commands of that epoch must not run (issue 15)
        self._confirmed_epoch: int | None = None
        self._seen = SeenCommands()  # a command published again (the broker lost its data) is not run twice
        # StartJobs of a later run of a job whose earlier run here is not over yet (a gang requeued, or a job
        # preempted, and placed on this node again while its run here still stops): started once that run's
        # end is reported, instead of waiting for placement's re-send
        self._after_run: dict[str, ev.StartJob] = {}
        # commands and the starts that waited for a run's end are carried out one at a time: a start must
        # not interleave with a StopJob or a ReconcileJobs of the same node
        self._lock = asyncio.Lock()
        exits.on_run_over = self._run_over

    async def on_command(self, message: Incoming) -> None:
        if message.key != self._ctx.node_id:
            return  # commands for other nodes share the topic
        envelope, payload = parse_event(message)
        if not self._seen.first_time(envelope.event_id, self._ctx.monotonic()):
            log.info("%s: %s %s seen before (published again): not carried out twice", self._ctx.node_id,
                     envelope.type, envelope.event_id)
            return
        async with self._lock:
            if isinstance(payload, ev.StartJob):
                await self._start_job(payload)
            elif isinstance(payload, ev.StopJob):
                self._drop_waiting(payload.job_id, payload.attempt, ExitReason.STOPPED,
                                   f"stopped before it started: {payload.reason}")
                if self._names_recorded_run(payload.job_id, payload.attempt):
                    self._exits.stop(payload.job_id, ExitReason.STOPPED)
            elif isinstance(payload, ev.PreemptJob):
                self._drop_waiting(payload.job_id, payload.attempt, ExitReason.PREEMPTED,
                                   f"preempted before it started: {payload.reason}")
                self.preempt(payload)
            elif isinstance(payload, ev.ReconcileJobs):
                await self._reconcile(payload)

    async def start_job(self, command: ev.StartJob) -> None:
        async with self._lock:
            await self._start_job(command)

    def _run_over(self, job_id: str) -> None:
        """The end of the job's run here was reported: a StartJob of its next run that waited for it starts."""
        waiting = self._after_run.pop(job_id, None)
        if waiting is not None:
            log.info("%s: %s's earlier run ended: starting run %d", self._ctx.node_id, job_id, waiting.attempt)
            self._ctx.spawn(self.start_job(waiting), f"start-after-{job_id}")

    def _drop_waiting(self, job_id: str, attempt: int | None, reason_code: str, error: str) -> None:
        """A stop or preemption of the run (``attempt``; None: any) that waits for the earlier one: it never
        starts, and says so."""
        waiting = self._after_run.get(job_id)
        if waiting is not None and attempt in (None, waiting.attempt):
            del self._after_run[job_id]
            self._report_not_started(job_id, f"{error[:300]} (on {self._ctx.node_id})", reason_code, waiting.attempt)

    def _names_recorded_run(self, job_id: str, attempt: int | None) -> bool:
        """Whether a stop or preemption of the job's run ``attempt`` (None: whichever) concerns the run this
        node recorded: that run, or an earlier one (not wanted either); a command about an earlier run than
        the recorded one (sent again, or late: preemption's commands are not ordered with placement's) is
        stale and leaves it be."""
        runner = self._ctx.runner
        if not runner.known(job_id):
            return False
        if attempt is None:
            return True
        try:
            record = runner.record(job_id)
        except BAD_RECORD:
            return True
        return record is None or record.attempt <= attempt

    async def _start_job(self, command: ev.StartJob) -> None:
        ctx = self._ctx
        if command.lease_epoch is not None and command.lease_epoch == ctx.lease.epoch \
                and self._confirmed_epoch != ctx.lease.epoch and len(self._held) < MAX_HELD_STARTS:
            self._held[command.job_id] = command  # the store has not answered this epoch yet: it decides
            return
        decision = decide_start(attempt=command.attempt, gpu_indices=command.gpu_indices,
                                previous=self._previous_run(command.job_id), lease_epoch=command.lease_epoch,
                                node=NodeFacts(ctx.node_id, ctx.lease.valid, frozenset(ctx.unhealthy_gpus()),
                                               ctx.lease.epoch))
        if isinstance(decision, Ignore):
            if decision.reason == OTHER_EPOCH and (command.lease_epoch or 0) < ctx.lease.epoch \
                    and len(self._held) < MAX_HELD_STARTS:
                self._held[command.job_id] = command  # the store decides: the next ReconcileJobs says
            log.debug("%s: StartJob %s (attempt %d) ignored: %s", ctx.node_id, command.job_id, command.attempt,
                      decision.reason)
            if decision.reason == DUPLICATE:
                self._acknowledge(command)
            elif decision.reason == RUN_NOT_OVER and len(self._after_run) < MAX_HELD_STARTS:
                waiting = self._after_run.get(command.job_id)
                if waiting is None or waiting.attempt <= command.attempt:
                    self._after_run[command.job_id] = command  # starts when the run here is over and reported
            return
        if decision.rerun:
            ctx.runner.finish_run(command.job_id)  # a new run of a job that ran here before
        if isinstance(decision, Refuse):
            self._report_not_started(command.job_id, decision.error, decision.reason_code, command.attempt)
            return
        await self._launch(command)

    def _acknowledge(self, command: ev.StartJob) -> None:
        """A StartJob sent again (placement heard no start): the run it names runs here, so say so again;
        placement takes a start it knows already as nothing new."""
        record = self._exits.running.get(command.job_id)
        if record is None or record.attempt != command.attempt:
            return
        ctx = self._ctx
        ctx.reporter.in_order(ev.JobStartReported(job_id=command.job_id, node_id=ctx.node_id, pid=record.pid,
                                                  started_at=datetime.fromtimestamp(record.started_at_s, timezone.utc),
                                                  lease_epoch=record.lease_epoch, attempt=record.attempt))

    def _previous_run(self, job_id: str) -> PreviousRun | None:
        runner = self._ctx.runner
        if not runner.known(job_id):
            return None
        record = runner.record(job_id)
        if record is None:
            return PreviousRun(None, runner.reported(job_id))
        return PreviousRun(record.attempt, runner.reported(job_id), runner.is_alive(record))

    async def _launch(self, command: ev.StartJob) -> None:
        ctx = self._ctx
        uuids = tuple(command.gpu_uuids)
        if command.mig_profile is not None:
            try:
                uuids = (ctx.backend.mig_device_for(command.job_id, command.gpu_indices[0], command.mig_profile,
                                                    command.mig_start or 0),)
            except ValueError as exc:
                self._report_not_started(
                    command.job_id, f"MIG {command.mig_profile} on GPU {command.gpu_indices[0]} of {ctx.node_id}: {exc}",
                    attempt=command.attempt)
                return
        job_env = job_environment(gpu_indices=tuple(command.gpu_indices), gpu_uuids=uuids,
                                  share_milli=command.gpu_share_milli, memory_mib=command.gpu_memory_mib,
                                  mps_pipe_dir=self._mps_dir())
        result = await ctx.runner.start(command.job_id, command.command, tuple(command.gpu_indices), command.env,
                                        owned={**job_env.env, **mig_env(command), **run_env(ctx.node_id, command)},
                                        tenant=command.tenant,
                                        lease_epoch=ctx.lease.epoch,
                                        share_milli=command.gpu_share_milli, memory_mib=command.gpu_memory_mib,
                                        attempt=command.attempt, time_limit_s=command.time_limit_s,
                                        limits=limits_for(command.cpu_milli, command.host_memory_mib,
                                                          tuple(command.gpu_indices), ctx.backend.device_minors()),
                                        image=command.image, devices=uuids, args=tuple(command.args))
        if isinstance(result, JobExit):
            ctx.reporter.in_order(ev.JobExitReported(job_id=result.job_id, node_id=ctx.node_id,
                                                     exit_code=result.exit_code, runtime_s=0.0, error=result.error,
                                                     lease_epoch=ctx.lease.epoch, attempt=command.attempt))
            return
        ctx.backend.attach(command.job_id, result.gpu_indices, result.pid, command.gpu_share_milli,
                           command.gpu_memory_mib)
        # queued, not awaited: a redelivered StartJob finds the job known, so this report must not be lost
        ctx.reporter.in_order(ev.JobStartReported(job_id=command.job_id, node_id=ctx.node_id, pid=result.pid,
                                                  started_at=datetime.fromtimestamp(result.started_at_s, timezone.utc),
                                                  lease_epoch=ctx.lease.epoch, unenforced=list(job_env.unenforced),
                                                  attempt=command.attempt))
        self._exits.watch(result, current_traceparent())

    def _report_not_started(self, job_id: str, error: str, reason_code: str | None = None,
                            attempt: int | None = None) -> None:
        self._ctx.reporter.in_order(ev.JobExitReported(job_id=job_id, node_id=self._ctx.node_id, exit_code=137,
                                                       runtime_s=0.0, error=error, lease_epoch=self._ctx.lease.epoch,
                                                       reason_code=reason_code, attempt=attempt))

    def _mps_dir(self) -> Path | None:
        pipe = self._ctx.config.mps_pipe_dir
        return pipe if pipe is not None and (pipe / "control").exists() else None

    def preempt(self, command: ev.PreemptJob) -> None:
        """Tell the job (SIGTERM and a notice file naming the deadline), SIGKILL it at the deadline."""
        runner = self._ctx.runner
        known = self._names_recorded_run(command.job_id, command.attempt)
        decision = decide_preempt(known=known, reported=known and runner.reported(command.job_id),
                                  stopping=self._exits.stopping(command.job_id), deadline_at=command.deadline_at,
                                  now=utcnow())
        if not isinstance(decision, Preempt):
            return  # never started here, ended and reported (placement hears the exit anyway), or stopping
        runner.write_preempt_notice(command.job_id, command.deadline_at, command.reason)
        log.info("%s: preempting %s (%s); grace %.1fs", self._ctx.node_id, command.job_id, command.reason,
                 decision.grace_s)
        self._exits.stop(command.job_id, ExitReason.PREEMPTED, grace_s=decision.grace_s)

    async def _reconcile(self, command: ev.ReconcileJobs) -> None:
        """The store's list of this node's jobs for the current epoch: a held StartJob it lists runs now
        (placed before the agent's new epoch was known, still meant for this node), the others are dropped
        (their node was declared lost, they run elsewhere); then what runs is reconciled with the list."""
        ctx = self._ctx
        if not rc.answers_epoch(command.lease_epoch, ctx.lease.epoch):
            return
        self._confirmed_epoch = ctx.lease.epoch
        # the list settles the starts that waited for an earlier run too: a wanted run not started is
        # reported missing (and queued again), so it must not start later
        self._after_run.clear()
        held, self._held = self._held, {}
        starting = [held[job_id] for job_id in command.job_ids if job_id in held
                    and (command.attempts is None or command.attempts.get(job_id) in (None, held[job_id].attempt))]
        # reconcile what ran before first, then start the held ones (watched from their start: a plan made
        # after would see one that ended at once and report its exit a second time)
        self._exits.apply(rc.plan_reconcile(ctx.runner.observe(),
                                            frozenset(command.job_ids) - {s.job_id for s in starting},
                                            lease_valid=ctx.lease.valid, attempts=command.attempts))
        for start in starting:
            await self._start_job(start.model_copy(update={"lease_epoch": ctx.lease.epoch}))


def mig_env(command: ev.StartJob) -> dict[str, str]:
    if command.mig_profile is None:
        return {}
    return {"GPUSCHED_MIG_PROFILE": command.mig_profile, "GPUSCHED_MIG_START": str(command.mig_start or 0)}


def run_env(node_id: str, command: ev.StartJob) -> dict[str, str]:
    """Which run of the job this is, and where: a job that resumes after a preemption or a requeue knows it
    is not its first (as SLURM_RESTART_COUNT and torchrun's restart count tell)."""
    return {"GPUSCHED_NODE_ID": node_id, "GPUSCHED_JOB_ATTEMPT": str(command.attempt)}
