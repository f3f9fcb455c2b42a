"""A job's state, rebuilt from its stream: `evolve(state, event)` folds one event in, `fold` a whole
history. Pure: no I/O and no clock; every field is derived from the events alone (except `trace_parent`)."""

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
    HELD = "Held"  # set aside while waiting: neither quota nor placement considers it until released
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
    submitted_by: str | None = None  # who submitted it (JobSubmitted), for the gateway's own-subject rules
    submitted_at: datetime | None = None  # when it was submitted: a released job goes back in line at it
    cancel: ev.JobCancelRequested | None = None  # a cancellation asked while it holds GPUs: it ends Cancelled


def evolve(state: JobState, event: ev.Payload) -> JobState:
    version = state.version + 1
    match event:
        case ev.JobSubmitted():
            return replace(state, version=version, spec=event.spec, submitted_by=event.submitted_by,
                           submitted_at=event.submitted_at)
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
        case ev.JobHeld():
            return replace(state, version=version, status=JobStatus.HELD, last_reasons=(f"held: {event.reason}",))
        case ev.JobReleased():
            return replace(state, version=version, status=JobStatus.ADMITTED, last_reasons=())
        case ev.JobCancelRequested():
            return replace(state, version=version, cancel=event, last_reasons=(f"cancelling: {event.reason}",))
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
