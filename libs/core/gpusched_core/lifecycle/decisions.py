"""`decide(state, command, now)`: the events a command produces in a job's current state.

It returns an empty tuple when the command was already applied or comes too late to matter (a repeated
or stale report, a second reservation), so redelivery is harmless, and raises `InvalidTransition` when
the command makes no sense in the current state. Pure: `now` is an argument, never read from a clock.

Each command has one handler, found by the command's type in `HANDLERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from gpusched_common import events as ev

from .commands import (
    Cancel, Command, DeferPlacement, Hold, Release, DeferQuota, Place, RecordCheckpoint, RecordExit, RecordStart,
    RegisterSubmission, ReleaseQuota, Requeue, RequestPreemption, ReserveQuota, SelectVictims,
)
from .state import HOLDS_GPUS, TERMINAL, JobState, JobStatus

Events = tuple[ev.Payload, ...]


class InvalidTransition(ValueError):
    pass


def decide(state: JobState, command: Command, now: datetime) -> Events:
    return _handler_for(command)(state, command, now)


def _register_submission(state: JobState, command: RegisterSubmission, now: datetime) -> Events:
    job = state.job_id
    if state.status is not None:
        return ()  # a duplicate submission of the same job id creates nothing
    if command.rejection_reasons or command.spec is None:
        tenant = command.spec.tenant if command.spec else command.tenant_hint
        return (ev.JobRejected(job_id=job, tenant=tenant, reasons=list(command.rejection_reasons)),)
    held = (ev.JobHeld(job_id=job, reason="submitted held", requested_by=command.submitted_by),) if command.hold else ()
    return (
        ev.JobSubmitted(job_id=job, spec=command.spec, submitted_at=command.submitted_at,
                        request_id=command.request_id, submitted_by=command.submitted_by,
                        producer=command.producer, hold=command.hold),
        ev.JobAdmitted(job_id=job, spec=command.spec, submitted_at=command.submitted_at,
                       submitted_by=command.submitted_by),
        *held,
    )


def _defer_quota(state: JobState, command: DeferQuota, now: datetime) -> Events:
    _require(state, command, JobStatus.ADMITTED)
    if state.last_reasons == (command.reason,):
        return ()  # the same reason again adds nothing to the history
    return (ev.QuotaDeferred(job_id=state.job_id, tenant=_spec(state).tenant, reason=command.reason),)


def _reserve_quota(state: JobState, command: ReserveQuota, now: datetime) -> Events:
    if state.quota_held or state.status in TERMINAL:
        return ()
    _require(state, command, JobStatus.ADMITTED)
    spec = _spec(state)
    return (ev.QuotaReserved(
        job_id=state.job_id, tenant=spec.tenant, gpus=spec.gpus, spec=spec,
        tenant_reserved_gpus=command.tenant_reserved_gpus, tenant_cap_gpus=command.tenant_cap_gpus,
        gpu_model=command.gpu_model, borrowed_gpus=command.borrowed_gpus,
    ),)


def _place(state: JobState, command: Place, now: datetime) -> Events:
    if state.status in HOLDS_GPUS and state.node_id == command.node_id:
        return ()
    _require(state, command, JobStatus.QUEUED)
    members = [ev.GangMember(rank=rank, node_id=m.node_id, gpu_indices=list(m.gpu_indices),
                             gpu_uuids=list(m.gpu_uuids)) for rank, m in enumerate(command.members)]
    return (ev.JobPlaced(
        job_id=state.job_id, node_id=command.node_id, gpu_indices=list(command.gpu_indices),
        gpu_uuids=list(command.gpu_uuids), gpu_model=command.gpu_model, policy=command.policy,
        reason=command.reason, members=members, gpu_share_milli=command.share_milli,
        gpu_memory_mib=command.share_memory_mib, mig_profile=command.mig_profile, mig_start=command.mig_start,
    ),)


def _defer_placement(state: JobState, command: DeferPlacement, now: datetime) -> Events:
    _require(state, command, JobStatus.QUEUED)
    if state.last_reasons == command.reasons:
        return ()
    return (ev.PlacementDeferred(job_id=state.job_id, reasons=list(command.reasons)),)


def _record_start(state: JobState, command: RecordStart, now: datetime) -> Events:
    if state.status is not JobStatus.PLACED:
        return ()  # a late or repeated start report changes nothing
    return (ev.JobStarted(job_id=state.job_id, node_id=command.node_id, pid=command.pid,
                          started_at=command.started_at),)


def _record_exit(state: JobState, command: RecordExit, now: datetime) -> Events:
    job = state.job_id
    if state.status not in HOLDS_GPUS or not _runs_on(state, command.node_id):
        return ()
    if command.node_id in state.exited_nodes:
        return ()  # this member's exit was recorded already
    if len(state.node_ids) > 1 and len(state.exited_nodes) + 1 < len(state.node_ids) and (
            state.status is JobStatus.PREEMPTING or state.cancel is not None
            or (command.exit_code == 0 and command.error is None)):
        # a gang member done (or stopped for a preemption) while others still run: the job goes on
        return (ev.GangMemberExited(job_id=job, node_id=command.node_id, exit_code=command.exit_code,
                                    runtime_s=command.runtime_s),)
    if state.cancel is not None:  # stopped as asked (or ended on its own meanwhile): the cancellation wins
        return (_cancelled(state),)
    if state.status is JobStatus.PREEMPTING:
        return (ev.JobPreempted(job_id=job, node_id=command.node_id, exit_code=command.exit_code,
                                checkpoint_ref=state.checkpoint_ref, lost_s=_lost_s(state, now)),)
    if command.exit_code == 0 and command.error is None:
        return (ev.JobSucceeded(job_id=job, node_id=command.node_id, runtime_s=command.runtime_s),)
    reason = command.error or f"command exited with code {command.exit_code}"
    if len(state.node_ids) > 1:
        rank = state.node_ids.index(command.node_id)
        reason = f"gang member {rank} on {command.node_id}: {reason}; the other members are stopped"
    return (ev.JobFailed(job_id=job, node_id=command.node_id, exit_code=command.exit_code, reason=reason),)


def _requeue(state: JobState, command: Requeue, now: datetime) -> Events:
    if state.status not in HOLDS_GPUS or not _runs_on(state, command.node_id):
        return ()  # already requeued, finished, or placed elsewhere since
    if state.cancel is not None:  # its node is gone with the process: nothing left to stop
        return (_cancelled(state),)
    return (ev.JobRequeued(job_id=state.job_id, node_id=command.node_id, reason=command.reason),)


def _request_preemption(state: JobState, command: RequestPreemption, now: datetime) -> Events:
    if state.status is JobStatus.PREEMPTING or state.status not in HOLDS_GPUS:
        return ()  # already asked, or no longer running: nothing to preempt
    assert state.node_id is not None
    return (ev.PreemptionRequested(
        job_id=state.job_id, node_id=state.node_id, preemptor_job_id=command.preemptor_job_id,
        preemptor_priority=command.preemptor_priority, preemptor_tenant=command.preemptor_tenant,
        reason=command.reason, grace_s=command.grace_s, deadline_at=command.deadline_at),)


def _select_victims(state: JobState, command: SelectVictims, now: datetime) -> Events:
    _require(state, command, JobStatus.QUEUED)
    return (ev.VictimsSelected(job_id=state.job_id, victims=list(command.victims),
                               node_ids=list(command.node_ids), reason=command.reason),)


def _record_checkpoint(state: JobState, command: RecordCheckpoint, now: datetime) -> Events:
    if state.status not in HOLDS_GPUS or state.checkpoint_ref == command.checkpoint_ref:
        return ()
    return (ev.JobCheckpointed(job_id=state.job_id, node_id=command.node_id, checkpoint_ref=command.checkpoint_ref,
                               checkpointed_at=command.checkpointed_at),)


def _release_quota(state: JobState, command: ReleaseQuota, now: datetime) -> Events:
    if not state.quota_held or (state.status not in TERMINAL and state.status not in (JobStatus.PREEMPTED,
                                                                                       JobStatus.HELD)):
        return ()
    spec = _spec(state)
    return (ev.QuotaReleased(job_id=state.job_id, tenant=spec.tenant, gpus=spec.gpus,
                             tenant_reserved_gpus=command.tenant_reserved_gpus),)


def _cancel(state: JobState, command: Cancel, now: datetime) -> Events:
    """A job that holds no GPUs ends Cancelled at once; one that does is asked to stop (its GPUs and quota
    are freed only when its agents report it gone: ``_record_exit``). Terminal, or asked already: nothing."""
    if state.status in TERMINAL or state.cancel is not None:
        return ()
    if state.status is None:
        raise InvalidTransition(f"job {state.job_id} does not exist")
    if state.status in HOLDS_GPUS:
        return (ev.JobCancelRequested(job_id=state.job_id, reason=command.reason, requested_by=command.requested_by),)
    return (ev.JobCancelled(job_id=state.job_id, reason=command.reason, requested_by=command.requested_by),)


HOLDABLE = frozenset({JobStatus.ADMITTED, JobStatus.QUEUED})  # waiting, and holding no GPUs


def _hold(state: JobState, command: Hold, now: datetime) -> Events:
    """A waiting job is set aside (quota gives back a reservation it held); held already: nothing. A job
    that runs or ended cannot be held."""
    if state.status is JobStatus.HELD:
        return ()
    if state.status not in HOLDABLE:
        raise InvalidTransition(f"job {state.job_id} is {state.status.value if state.status else 'unknown'}: "
                                "only a waiting job (Admitted or Queued) can be held")
    return (ev.JobHeld(job_id=state.job_id, reason=command.reason, requested_by=command.requested_by),)


def _release(state: JobState, command: Release, now: datetime) -> Events:
    """A held job goes back in line at its original submission time; one not held: nothing."""
    if state.status is not JobStatus.HELD:
        return ()
    assert state.submitted_at is not None
    return (ev.JobReleased(job_id=state.job_id, submitted_at=state.submitted_at, requested_by=command.requested_by),)


def _cancelled(state: JobState) -> ev.JobCancelled:
    assert state.cancel is not None
    return ev.JobCancelled(job_id=state.job_id, reason=state.cancel.reason, requested_by=state.cancel.requested_by)


# each handler takes its own command type, so the table can only say "some command" (Any) for the argument;
# decide looks the handler up by the command's type, which keeps the pair consistent
HANDLERS: Mapping[type, Callable[[JobState, Any, datetime], Events]] = {
    RegisterSubmission: _register_submission,
    DeferQuota: _defer_quota,
    ReserveQuota: _reserve_quota,
    Place: _place,
    DeferPlacement: _defer_placement,
    RecordStart: _record_start,
    RecordExit: _record_exit,
    Requeue: _requeue,
    RequestPreemption: _request_preemption,
    SelectVictims: _select_victims,
    RecordCheckpoint: _record_checkpoint,
    ReleaseQuota: _release_quota,
    Cancel: _cancel,
    Hold: _hold,
    Release: _release,
}


def _handler_for(command: Command) -> Callable[[JobState, Any, datetime], Events]:
    for cls in type(command).__mro__:  # a subclass of a command is handled as that command
        if (handler := HANDLERS.get(cls)) is not None:
            return handler
    raise InvalidTransition(f"unknown command {command!r}")


def _runs_on(state: JobState, node_id: str) -> bool:
    return node_id in state.node_ids if state.node_ids else state.node_id == node_id


def _lost_s(state: JobState, now: datetime) -> float:
    """Run time since the last checkpoint of this run (or since its start): the work a preemption loses."""
    since = max((t for t in (state.checkpointed_at, state.started_at) if t is not None), default=None)
    return round(max(0.0, (now - since).total_seconds()), 3) if since else 0.0


def _require(state: JobState, command: Command, status: JobStatus) -> None:
    if state.status is not status:
        raise InvalidTransition(
            f"{type(command).__name__} needs job {state.job_id} {status.value}, "
            f"but it is {state.status.value if state.status else 'unknown'}"
        )


def _spec(state: JobState) -> ev.JobSpec:
    if state.spec is None:
        raise InvalidTransition(f"job {state.job_id} has no accepted specification")
    return state.spec
