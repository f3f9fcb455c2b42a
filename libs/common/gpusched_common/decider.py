"""The job lifecycle as a pure decider (DESIGN.md section 4).

    Submitted -> Admitted | Rejected
    Admitted -> Queued (quota reserved) -> Placed -> Running -> Succeeded | Failed | Cancelled
    Placed | Running -> Queued (requeued: its node was lost or its GPU failed)
    Placed | Running -> Preempting -> Preempted -> (quota released) Admitted -> Queued -> ... resumes from
    its last checkpoint

`decide(state, command, now)` returns the events a command produces (an empty tuple when the command was
already applied, so redelivery is harmless) and raises `InvalidTransition` when the command makes no sense
in the current state. `evolve(state, event)` folds one event into the state. Both are pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum

from gpusched_common import events as ev


class JobStatus(str, Enum):
    ADMITTED = "Admitted"
    REJECTED = "Rejected"
    QUEUED = "Queued"
    PLACED = "Placed"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    PREEMPTING = "Preempting"
    PREEMPTED = "Preempted"


TERMINAL = frozenset({JobStatus.REJECTED, JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
HOLDS_GPUS = frozenset({JobStatus.PLACED, JobStatus.RUNNING, JobStatus.PREEMPTING})


@dataclass(frozen=True)
class JobState:
    job_id: str
    status: JobStatus | None = None  # None: the stream does not exist yet
    version: int = 0
    spec: ev.JobSpec | None = None
    quota_held: bool = False
    node_id: str | None = None  # the (first) node it runs on
    gpu_indices: tuple[int, ...] = ()
    node_ids: tuple[str, ...] = ()  # every node it runs on: one, or each member of a gang
    exited_nodes: tuple[str, ...] = ()  # gang members that finished their part of this run
    exit_code: int | None = None
    last_reasons: tuple[str, ...] = ()
    # the W3C traceparent of the job's latest event (set when loaded from the store, not by evolve), so
    # that work done for the job outside any message span still joins the job's trace
    trace_parent: str | None = None
    checkpoint_ref: str | None = None
    checkpointed_at: datetime | None = None
    started_at: datetime | None = None
    preemptor: str | None = None  # while Preempting: the job it makes room for
    runs: int = 0  # how many times the job was placed (its current run's attempt number)
    charged_model: str | None = None  # the GPU model (flavor) its quota reservation was charged for


class InvalidTransition(ValueError):
    pass


# --- commands --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisterSubmission:
    spec: ev.JobSpec | None
    submitted_at: datetime
    rejection_reasons: tuple[str, ...] = ()
    tenant_hint: str | None = None  # for a submission whose spec could not be parsed
    request_id: str | None = None
    submitted_by: str | None = None  # the credential key that authenticated the submission


@dataclass(frozen=True)
class DeferQuota:
    reason: str


@dataclass(frozen=True)
class ReserveQuota:
    tenant_reserved_gpus: int
    tenant_cap_gpus: int
    gpu_model: str | None = None  # the flavor charged, when the quota is per GPU model
    borrowed_gpus: float = 0.0


@dataclass(frozen=True)
class Member:
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class Place:
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_model: str
    policy: str
    reason: str
    members: tuple[Member, ...] = ()  # every node of a gang, rank order (node_id is members[0])
    share_milli: int | None = None
    share_memory_mib: int | None = None
    mig_profile: str | None = None
    mig_start: int | None = None


@dataclass(frozen=True)
class DeferPlacement:
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class RecordStart:
    node_id: str
    pid: int
    started_at: datetime


@dataclass(frozen=True)
class RecordExit:
    node_id: str
    exit_code: int
    runtime_s: float
    error: str | None = None


@dataclass(frozen=True)
class Requeue:
    node_id: str
    reason: str


@dataclass(frozen=True)
class RequestPreemption:
    preemptor_job_id: str
    preemptor_priority: int
    preemptor_tenant: str
    reason: str
    grace_s: float
    deadline_at: datetime


@dataclass(frozen=True)
class SelectVictims:
    victims: tuple[str, ...]
    node_ids: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class RecordCheckpoint:
    node_id: str
    checkpoint_ref: str
    checkpointed_at: datetime


@dataclass(frozen=True)
class ReleaseQuota:
    tenant_reserved_gpus: int


@dataclass(frozen=True)
class Cancel:
    reason: str


Command = (
    RegisterSubmission | DeferQuota | ReserveQuota | Place | DeferPlacement | RecordStart | RecordExit
    | Requeue | RequestPreemption | SelectVictims | RecordCheckpoint | ReleaseQuota | Cancel
)


def decide(state: JobState, command: Command, now: datetime) -> tuple[ev.Payload, ...]:
    job = state.job_id
    match command:
        case RegisterSubmission():
            if state.status is not None:
                return ()  # a duplicate submission of the same job id creates nothing
            if command.rejection_reasons or command.spec is None:
                tenant = command.spec.tenant if command.spec else command.tenant_hint
                return (ev.JobRejected(job_id=job, tenant=tenant, reasons=list(command.rejection_reasons)),)
            return (
                ev.JobSubmitted(job_id=job, spec=command.spec, submitted_at=command.submitted_at,
                                request_id=command.request_id, submitted_by=command.submitted_by),
                ev.JobAdmitted(job_id=job, spec=command.spec, submitted_at=command.submitted_at,
                               submitted_by=command.submitted_by),
            )
        case DeferQuota():
            _require(state, command, JobStatus.ADMITTED)
            if state.last_reasons == (command.reason,):
                return ()  # the same reason again adds nothing to the history
            return (ev.QuotaDeferred(job_id=job, tenant=_spec(state).tenant, reason=command.reason),)
        case ReserveQuota():
            if state.quota_held or state.status in TERMINAL:
                return ()
            _require(state, command, JobStatus.ADMITTED)
            spec = _spec(state)
            return (ev.QuotaReserved(
                job_id=job, tenant=spec.tenant, gpus=spec.gpus, spec=spec,
                tenant_reserved_gpus=command.tenant_reserved_gpus, tenant_cap_gpus=command.tenant_cap_gpus,
                gpu_model=command.gpu_model, borrowed_gpus=command.borrowed_gpus,
            ),)
        case Place():
            if state.status in HOLDS_GPUS and state.node_id == command.node_id:
                return ()
            _require(state, command, JobStatus.QUEUED)
            members = [ev.GangMember(rank=rank, node_id=m.node_id, gpu_indices=list(m.gpu_indices),
                                     gpu_uuids=list(m.gpu_uuids)) for rank, m in enumerate(command.members)]
            return (ev.JobPlaced(
                job_id=job, node_id=command.node_id, gpu_indices=list(command.gpu_indices),
                gpu_uuids=list(command.gpu_uuids), gpu_model=command.gpu_model, policy=command.policy,
                reason=command.reason, members=members, gpu_share_milli=command.share_milli,
                gpu_memory_mib=command.share_memory_mib, mig_profile=command.mig_profile, mig_start=command.mig_start,
            ),)
        case DeferPlacement():
            _require(state, command, JobStatus.QUEUED)
            if state.last_reasons == command.reasons:
                return ()
            return (ev.PlacementDeferred(job_id=job, reasons=list(command.reasons)),)
        case RecordStart():
            if state.status is not JobStatus.PLACED:
                return ()  # a late or repeated start report changes nothing
            return (ev.JobStarted(job_id=job, node_id=command.node_id, pid=command.pid,
                                  started_at=command.started_at),)
        case RecordExit():
            if state.status not in HOLDS_GPUS or not _runs_on(state, command.node_id):
                return ()
            if command.node_id in state.exited_nodes:
                return ()  # this member's exit was recorded already
            if len(state.node_ids) > 1 and len(state.exited_nodes) + 1 < len(state.node_ids) and (
                    state.status is JobStatus.PREEMPTING or (command.exit_code == 0 and command.error is None)):
                # a gang member done (or stopped for a preemption) while others still run: the job goes on
                return (ev.GangMemberExited(job_id=job, node_id=command.node_id, exit_code=command.exit_code,
                                            runtime_s=command.runtime_s),)
            if state.status is JobStatus.PREEMPTING:
                return (ev.JobPreempted(job_id=job, node_id=command.node_id, exit_code=command.exit_code,
                                        checkpoint_ref=state.checkpoint_ref, lost_s=_lost_s(state, now)),)
            if command.exit_code == 0 and command.error is None:
                return (ev.JobSucceeded(job_id=job, node_id=command.node_id, runtime_s=command.runtime_s),)
            reason = command.error or f"command exited with code {command.exit_code}"
            if len(state.node_ids) > 1:
                rank = state.node_ids.index(command.node_id)
                reason = f"gang member {rank} on {command.node_id}: {reason}; the other members are stopped"
            return (ev.JobFailed(job_id=job, node_id=command.node_id, exit_code=command.exit_code,
                                 reason=reason),)
        case Requeue():
            if state.status not in HOLDS_GPUS or not _runs_on(state, command.node_id):
                return ()  # already requeued, finished, or placed elsewhere since
            return (ev.JobRequeued(job_id=job, node_id=command.node_id, reason=command.reason),)
        case RequestPreemption():
            if state.status is JobStatus.PREEMPTING or state.status not in HOLDS_GPUS:
                return ()  # already asked, or no longer running: nothing to preempt
            assert state.node_id is not None
            return (ev.PreemptionRequested(
                job_id=job, node_id=state.node_id, preemptor_job_id=command.preemptor_job_id,
                preemptor_priority=command.preemptor_priority, preemptor_tenant=command.preemptor_tenant,
                reason=command.reason, grace_s=command.grace_s, deadline_at=command.deadline_at),)
        case SelectVictims():
            _require(state, command, JobStatus.QUEUED)
            return (ev.VictimsSelected(job_id=job, victims=list(command.victims), node_ids=list(command.node_ids),
                                       reason=command.reason),)
        case RecordCheckpoint():
            if state.status not in HOLDS_GPUS or state.checkpoint_ref == command.checkpoint_ref:
                return ()
            return (ev.JobCheckpointed(job_id=job, node_id=command.node_id, checkpoint_ref=command.checkpoint_ref,
                                       checkpointed_at=command.checkpointed_at),)
        case ReleaseQuota():
            if not state.quota_held or (state.status not in TERMINAL and state.status is not JobStatus.PREEMPTED):
                return ()
            spec = _spec(state)
            return (ev.QuotaReleased(job_id=job, tenant=spec.tenant, gpus=spec.gpus,
                                     tenant_reserved_gpus=command.tenant_reserved_gpus),)
        case Cancel():
            if state.status in TERMINAL:
                return ()
            if state.status is None:
                raise InvalidTransition(f"job {job} does not exist")
            return (ev.JobCancelled(job_id=job, reason=command.reason),)
    raise InvalidTransition(f"unknown command {command!r}")


def evolve(state: JobState, event: ev.Payload) -> JobState:
    version = state.version + 1
    match event:
        case ev.JobSubmitted():
            return replace(state, version=version, spec=event.spec)
        case ev.JobAdmitted():
            return replace(state, version=version, status=JobStatus.ADMITTED, spec=event.spec)
        case ev.JobRejected():
            return replace(state, version=version, status=JobStatus.REJECTED, last_reasons=tuple(event.reasons))
        case ev.QuotaDeferred():
            return replace(state, version=version, last_reasons=(event.reason,))
        case ev.QuotaReserved():
            return replace(state, version=version, status=JobStatus.QUEUED, quota_held=True, last_reasons=(),
                           charged_model=event.gpu_model)
        case ev.JobPlaced():
            return replace(state, version=version, status=JobStatus.PLACED, node_id=event.node_id,
                           gpu_indices=tuple(event.gpu_indices), node_ids=tuple(event.node_ids), exited_nodes=(),
                           last_reasons=(), runs=state.runs + 1)
        case ev.PlacementDeferred():
            return replace(state, version=version, last_reasons=tuple(event.reasons))
        case ev.GangMemberExited():
            return replace(state, version=version, exited_nodes=(*state.exited_nodes, event.node_id))
        case ev.JobStarted():
            return replace(state, version=version, status=JobStatus.RUNNING, started_at=event.started_at)
        case ev.PreemptionRequested():
            return replace(state, version=version, status=JobStatus.PREEMPTING, preemptor=event.preemptor_job_id,
                           last_reasons=(event.reason,))
        case ev.VictimsSelected():
            return replace(state, version=version, last_reasons=(event.reason,))
        case ev.JobCheckpointed():
            return replace(state, version=version, checkpoint_ref=event.checkpoint_ref,
                           checkpointed_at=event.checkpointed_at)
        case ev.JobPreempted():
            return replace(state, version=version, status=JobStatus.PREEMPTED, node_id=None, gpu_indices=(),
                           node_ids=(), exited_nodes=(), preemptor=None, started_at=None)
        case ev.JobSucceeded():
            return replace(state, version=version, status=JobStatus.SUCCEEDED, exit_code=event.exit_code)
        case ev.JobFailed():
            return replace(state, version=version, status=JobStatus.FAILED, exit_code=event.exit_code,
                           last_reasons=(event.reason,))
        case ev.JobCancelled():
            return replace(state, version=version, status=JobStatus.CANCELLED, last_reasons=(event.reason,))
        case ev.JobRequeued():
            return replace(state, version=version, status=JobStatus.QUEUED, node_id=None, gpu_indices=(),
                           node_ids=(), exited_nodes=(), last_reasons=(event.reason,))
        case ev.QuotaReleased():
            if state.status is JobStatus.PREEMPTED:  # back in line for quota, to resume from its checkpoint
                return replace(state, version=version, quota_held=False, status=JobStatus.ADMITTED)
            return replace(state, version=version, quota_held=False)
    return replace(state, version=version)


def fold(job_id: str, history: list[ev.Payload] | tuple[ev.Payload, ...]) -> JobState:
    state = JobState(job_id=job_id)
    for event in history:
        state = evolve(state, event)
    return state


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
