"""What a job asks for, and the events of a job's stream."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from gpusched_common.events.base import Frozen, Payload


# --- job specification -----------------------------------------------------------------------------


class JobSpec(Frozen):
    """What a user asks for. Ranges are checked by admission (with reasons), not by the parser."""

    tenant: str
    gpus: int
    gpu_model: str | None = None
    priority: int = 0
    command: list[str]
    name: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


# --- job stream events -----------------------------------------------------------------------------


class JobSubmitted(Payload):
    TYPE: ClassVar[str] = "JobSubmitted"
    job_id: str
    spec: JobSpec
    submitted_at: datetime
    request_id: str | None = None  # the client's idempotency key: a repeat creates no second job
    submitted_by: str | None = None  # set by admission: the credential key that authenticated it


class JobAdmitted(Payload):
    TYPE: ClassVar[str] = "JobAdmitted"
    job_id: str
    spec: JobSpec
    submitted_at: datetime
    submitted_by: str | None = None


class JobRejected(Payload):
    TYPE: ClassVar[str] = "JobRejected"
    job_id: str
    tenant: str | None = None
    reasons: list[str]


class QuotaDeferred(Payload):
    TYPE: ClassVar[str] = "QuotaDeferred"
    job_id: str
    tenant: str
    reason: str


class QuotaReserved(Payload):
    TYPE: ClassVar[str] = "QuotaReserved"
    job_id: str
    tenant: str
    gpus: int
    tenant_reserved_gpus: int
    tenant_cap_gpus: int
    spec: JobSpec
    # the GPU model the quota was charged for (tenancy mode), which placement must then honour; and how
    # much of the reservation is borrowed from the tenant's cohort, in GPUs
    gpu_model: str | None = None
    borrowed_gpus: float = 0.0


class JobPlaced(Payload):
    TYPE: ClassVar[str] = "JobPlaced"
    job_id: str
    node_id: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    gpu_model: str
    policy: str
    reason: str


class PlacementDeferred(Payload):
    TYPE: ClassVar[str] = "PlacementDeferred"
    job_id: str
    reasons: list[str]


class JobStarted(Payload):
    TYPE: ClassVar[str] = "JobStarted"
    job_id: str
    node_id: str
    pid: int
    started_at: datetime


class JobSucceeded(Payload):
    TYPE: ClassVar[str] = "JobSucceeded"
    job_id: str
    node_id: str
    exit_code: int = 0
    runtime_s: float


class JobFailed(Payload):
    TYPE: ClassVar[str] = "JobFailed"
    job_id: str
    node_id: str | None = None
    exit_code: int | None = None
    reason: str


class JobCancelled(Payload):
    TYPE: ClassVar[str] = "JobCancelled"
    job_id: str
    reason: str


class PreemptionRequested(Payload):
    """The job is asked to stop for a higher-priority one; it may checkpoint until `deadline_at`."""

    TYPE: ClassVar[str] = "PreemptionRequested"
    job_id: str
    node_id: str
    preemptor_job_id: str
    preemptor_priority: int
    preemptor_tenant: str
    reason: str
    grace_s: float
    deadline_at: datetime


class VictimsSelected(Payload):
    """On the preemptor's stream: which jobs are preempted for it and why (the other side of each
    PreemptionRequested)."""

    TYPE: ClassVar[str] = "VictimsSelected"
    job_id: str
    victims: list[str]
    node_ids: list[str]
    reason: str


class JobCheckpointed(Payload):
    TYPE: ClassVar[str] = "JobCheckpointed"
    job_id: str
    node_id: str
    checkpoint_ref: str
    checkpointed_at: datetime


class JobPreempted(Payload):
    """The job stopped for a preemption; it waits for quota and placement again and resumes from
    `checkpoint_ref` (None: from the start)."""

    TYPE: ClassVar[str] = "JobPreempted"
    job_id: str
    node_id: str
    exit_code: int
    checkpoint_ref: str | None = None
    lost_s: float  # run time since the last checkpoint (or since the start), i.e. work lost


class JobRequeued(Payload):
    """The job lost its GPUs through no fault of its own (node lost, GPU failed) and waits to be placed
    again; it keeps its quota reservation."""

    TYPE: ClassVar[str] = "JobRequeued"
    job_id: str
    node_id: str
    reason: str


class QuotaReleased(Payload):
    TYPE: ClassVar[str] = "QuotaReleased"
    job_id: str
    tenant: str
    gpus: int
    tenant_reserved_gpus: int
