"""What a job asks for, and the events of a job's stream."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

from gpusched_common.events.base import Frozen, Payload


# --- job specification -----------------------------------------------------------------------------


class GpuShareSpec(Frozen):
    """A fraction of one GPU: ``milli`` thousandths of its compute (1..999) and ``memory_mib`` of its
    memory (0: no memory reservation). Enforced through MPS where the node runs it."""

    milli: int
    memory_mib: int = 0


class ArrayTask(Frozen):
    """One task of a job array (``gpusched submit --array 0-99%8``): the array's id, this task's index
    (its job id is ``<array_id>.<index>``), how many tasks the array has, and how many may hold GPUs at
    once (None: no cap). Set by the gateway when it expands the array, never by the user."""

    array_id: str
    index: int
    size: int
    max_running: int | None = None


class Dependency(Frozen):
    """A job this one waits for (``--after JOB[:ok|:any]``): ``ok`` until it succeeds (a failure or a
    cancellation means this job can never run, and it ends Cancelled with that reason); ``any`` until it
    ends, however it ends."""

    job_id: str
    condition: Literal["ok", "any"] = "ok"


class JobSpec(Frozen):
    """What a user asks for. Ranges are checked by admission (with reasons), not by the parser.

    Four shapes: ``gpus`` whole GPUs on one node; a gang of ``nodes`` nodes with ``gpus`` whole GPUs each,
    placed all or nothing; a ``gpu_share`` of one GPU; one MIG slice of ``mig_profile`` (e.g. ``3g.40gb``).
    With a share or a MIG profile ``gpus`` is 1 (the one GPU the fraction is of) and ``nodes`` is 1.
    ``cpu_milli`` and ``memory_mib`` are host CPU (milli-cores) and memory the job needs on each of its
    nodes besides the GPUs (0: none asked; placement then counts none).
    """

    tenant: str
    gpus: int
    gpu_model: str | None = None
    nodes: int = 1
    gpu_share: GpuShareSpec | None = None
    mig_profile: str | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    # a priority class of the tenancy by name (Kubernetes' priorityClassName): admission sets ``priority`` to
    # its value, and refuses a name the tenancy does not have
    priority_class: str | None = None
    # what runs: ``command`` as a host process, or in a container of ``image`` on a node with a container
    # runtime (an empty ``command`` then runs the image's entrypoint)
    command: list[str] = Field(default_factory=list)
    image: str | None = None
    # with an image and no command: the arguments its entrypoint runs with (a pod's ``args`` alone)
    args: list[str] = Field(default_factory=list)
    name: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # the longest one run may hold its GPUs: the agent stops it then (SIGTERM, a grace, SIGKILL) and it
    # ends Failed, "time limit 2h reached"; None: the tenant's default (the tenancy), else no limit
    time_limit_s: float | None = None
    array: ArrayTask | None = None  # a task of a job array (set by the gateway's expansion)
    after: list[Dependency] = Field(default_factory=list)  # jobs of the same tenant to wait for
    # node labels every node of the job must carry (Kubernetes' nodeSelector and required node affinity
    # with ``In`` of one value), besides the GPU model
    node_selector: dict[str, str] = Field(default_factory=dict)

    @property
    def kind(self) -> str:
        """``share``, ``mig``, ``gang`` or ``whole``."""
        if self.gpu_share is not None:
            return "share"
        if self.mig_profile is not None:
            return "mig"
        return "gang" if self.nodes > 1 else "whole"

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs the job holds across all its nodes (0 for a share or a MIG slice)."""
        return 0 if self.kind in ("share", "mig") else self.gpus * self.nodes

    def describe(self) -> str:
        """``4 GPU``, ``2x8 GPU (gang)``, ``0.5 GPU share``, ``MIG 3g.40gb``, with the model if any."""
        model = f" {self.gpu_model}" if self.gpu_model else ""
        if self.gpu_share is not None:
            memory = f", {self.gpu_share.memory_mib} MiB" if self.gpu_share.memory_mib else ""
            return f"{self.gpu_share.milli / 1000:g}{model} GPU share{memory}"
        if self.mig_profile is not None:
            return f"MIG {self.mig_profile}{model}"
        if self.nodes > 1:
            return f"{self.nodes}x{self.gpus}{model} GPU (gang)"
        return f"{self.gpus}{model} GPU"


# --- job stream events -----------------------------------------------------------------------------


class JobSubmitted(Payload):
    TYPE: ClassVar[str] = "JobSubmitted"
    job_id: str
    spec: JobSpec
    submitted_at: datetime
    request_id: str | None = None  # the client's idempotency key: a repeat creates no second job
    hold: bool = False  # submitted held: admitted, then held until released (gpusched submit --hold)
    # set by admission from the verified credential, never taken from the payload as sent, except that a
    # producer allowed to attest (the gateway) names here the principal that submitted through it
    submitted_by: str | None = None  # who submitted: the attested principal, the producer, or the key id
    producer: str | None = None  # the producer credential that signed the submission


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


class GangMember(Frozen):
    """One node of a gang placement; ``rank`` 0 is the gang's first node (its ``node_id``)."""

    rank: int
    node_id: str
    gpu_indices: list[int]
    gpu_uuids: list[str]


class JobPlaced(Payload):
    """Where the job runs. ``node_id``/``gpu_indices`` are its (first) node and GPUs; a gang lists every
    node in ``members``; a share or MIG slice says which part of the GPU it got."""

    TYPE: ClassVar[str] = "JobPlaced"
    job_id: str
    node_id: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    gpu_model: str
    policy: str
    reason: str
    members: list[GangMember] = Field(default_factory=list)
    gpu_share_milli: int | None = None
    gpu_memory_mib: int | None = None
    mig_profile: str | None = None
    mig_start: int | None = None  # first memory slice of the MIG instance

    @property
    def node_ids(self) -> list[str]:
        return [m.node_id for m in self.members] or [self.node_id]


class GangMemberExited(Payload):
    """One node of a gang finished its part (exit 0, or stopped while the gang is preempted); the job
    ends when the last member does."""

    TYPE: ClassVar[str] = "GangMemberExited"
    job_id: str
    node_id: str
    exit_code: int
    runtime_s: float


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
    requested_by: str | None = None  # who cancelled it (the principal the gateway attested)


class JobCancelRequested(Payload):
    """A job that holds GPUs is to be cancelled: its agents stop it (SIGTERM, grace, SIGKILL) and it ends
    ``Cancelled`` once they report the process gone; until then its GPUs and quota stay held. Appended by
    admission (deciding a verified ``CancelJob``) on the job's stream; placement acts on it."""

    TYPE: ClassVar[str] = "JobCancelRequested"
    job_id: str
    reason: str
    requested_by: str | None = None


class JobHeld(Payload):
    """A waiting job set aside: quota and placement no longer consider it (a reservation it held is given
    back) until it is released; it keeps its place in history and its submission time. Appended by
    admission (a verified ``HoldJob``, or a submission made held); quota and placement act on it."""

    TYPE: ClassVar[str] = "JobHeld"
    job_id: str
    reason: str
    requested_by: str | None = None


class JobReleased(Payload):
    """A held job back in line for quota, at its original submission time. Appended by admission (a
    verified ``ReleaseJob``); quota reads the job's place in line from its stream, not from this payload."""

    TYPE: ClassVar[str] = "JobReleased"
    job_id: str
    submitted_at: datetime
    requested_by: str | None = None


class HoldJob(Payload):
    """A request to hold a waiting job, on ``gpusched.jobs.control`` (only from the gateway, like CancelJob)."""

    TYPE: ClassVar[str] = "HoldJob"
    job_id: str
    reason: str
    requested_by: str


class ReleaseJob(Payload):
    """A request to release a held job, on ``gpusched.jobs.control`` (only from the gateway)."""

    TYPE: ClassVar[str] = "ReleaseJob"
    job_id: str
    reason: str
    requested_by: str


class CancelJob(Payload):
    """A request to cancel a job, on ``gpusched.jobs.control``. Only a producer that may attest (the
    gateway, having authorized the caller) may send it; admission verifies the producer and decides."""

    TYPE: ClassVar[str] = "CancelJob"
    job_id: str
    reason: str
    requested_by: str


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
