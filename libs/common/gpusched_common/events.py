"""Event envelope and payload models: the contract between services (DESIGN.md section 3).

Every message on the bus is an `Envelope` whose `payload` validates against the model registered for
its `type`. Models are frozen and forbid unknown fields; each carries its own schema version so that
readers can upcast old versions later.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Payload(Frozen):
    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1


class Envelope(Frozen):
    event_id: str
    type: str
    schema_version: int
    stream_id: str
    stream_version: int | None = None  # set for event-sourced events, None for commands and reports
    occurred_at: datetime
    producer: str
    tenant: str | None = None
    traceparent: str | None = None
    payload: dict


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


# --- node commands and reports ---------------------------------------------------------------------


class StartJob(Payload):
    TYPE: ClassVar[str] = "StartJob"
    job_id: str
    node_id: str
    tenant: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    attempt: int = 1  # which run of the job this is: a requeued or preempted job runs again
    # a fraction of one GPU (DESIGN.md section 5): enforced through MPS where the node runs it
    gpu_share_milli: int | None = None
    gpu_memory_mib: int | None = None
    mig_profile: str | None = None  # with MIG, gpu_uuids are the MIG devices' UUIDs


class PreemptJob(Payload):
    """To an agent: notify the job (SIGTERM and a notice file naming the deadline), SIGKILL it at the
    deadline if it has not exited, then report its exit with reason_code `preempted`."""

    TYPE: ClassVar[str] = "PreemptJob"
    job_id: str
    node_id: str
    grace_s: float
    deadline_at: datetime
    reason: str


class JobCheckpointReported(Payload):
    """From an agent: the job wrote a new checkpoint reference to its checkpoint file."""

    TYPE: ClassVar[str] = "JobCheckpointReported"
    job_id: str
    node_id: str
    checkpoint_ref: str
    checkpointed_at: datetime
    lease_epoch: int | None = None


class StopJob(Payload):
    TYPE: ClassVar[str] = "StopJob"
    job_id: str
    node_id: str
    reason: str


class MigDeviceInventory(Frozen):
    """One MIG device (GPU instance + compute instance) of a GPU in MIG mode."""

    uuid: str
    profile: str  # e.g. 1g.10gb
    gpu_instance_id: int
    memory_mib: int
    start_slice: int | None = None


class GpuInventory(Frozen):
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_enabled: bool = False
    nvlink_domain: str | None = None
    mig_devices: list[MigDeviceInventory] = Field(default_factory=list)
    nvlink_peers: list[int] = Field(default_factory=list)  # indices of GPUs on this node joined by NVLink
    pci_bus_id: str | None = None
    healthy: bool = True


class NodeRegistered(Payload):
    TYPE: ClassVar[str] = "NodeRegistered"
    node_id: str
    hostname: str
    gpus: list[GpuInventory]
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str] = Field(default_factory=dict)
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_backend: str
    # the agent's lease epoch: it grows each time an agent (re)starts or regains a lease it lost
    lease_epoch: int = 0
    running_jobs: list[str] = Field(default_factory=list)  # jobs the agent adopted at (re)registration


class NodeHeartbeat(Payload):
    TYPE: ClassVar[str] = "NodeHeartbeat"
    node_id: str
    running_jobs: list[str]
    # Lease contract: the agent fences itself (stops every job) when it has not had a heartbeat accepted by
    # the broker for lease_ttl_s; the owner of allocations may declare the node lost only after
    # lease_ttl_s + fence_grace_s without a heartbeat of this epoch. 0 means the agent holds no lease.
    lease_epoch: int = 0
    lease_ttl_s: float = 0.0
    fence_grace_s: float = 0.0
    unhealthy_gpus: list[int] = Field(default_factory=list)


class JobStartReported(Payload):
    TYPE: ClassVar[str] = "JobStartReported"
    job_id: str
    node_id: str
    pid: int
    started_at: datetime
    lease_epoch: int | None = None
    unenforced: list[str] = Field(default_factory=list)  # parts of a GPU share the node could not enforce


class JobExitReported(Payload):
    TYPE: ClassVar[str] = "JobExitReported"
    job_id: str
    node_id: str
    exit_code: int
    runtime_s: float
    error: str | None = None  # set when the command could not even be started
    lease_epoch: int | None = None
    # why the agent ended or lost the job, when it was not the job's own doing:
    # gpu_unhealthy | lease_lost | not_assigned | missing_after_restart | stopped
    reason_code: str | None = None


class GpuProcessSample(Frozen):
    pid: int
    memory_used_mib: int
    job_id: str | None = None  # None: a process no job of this agent owns


class GpuSample(Frozen):
    index: int
    uuid: str
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    power_w: float
    temperature_c: float
    sm_clock_mhz: int
    processes: list[GpuProcessSample] = Field(default_factory=list)
    throttle_reasons: list[str] = Field(default_factory=list)
    healthy: bool = True


class GpuTelemetry(Payload):
    TYPE: ClassVar[str] = "GpuTelemetry"
    node_id: str
    sampled_at: datetime
    samples: list[GpuSample]


class GpuHealthChanged(Payload):
    """A GPU's health changed. Unhealthy (`healthy=False`) means: cordon it, place nothing new on it.

    status: healthy | degraded (throttling; still schedulable) | unhealthy (XID, ECC) | lost (off the bus).
    `job_ids` are the jobs that held the GPU; `job_action` says what the agent did to them by policy
    (`stopped`: each gets a JobExitReported with reason_code gpu_unhealthy; `kept`: left running).
    """

    TYPE: ClassVar[str] = "GpuHealthChanged"
    node_id: str
    gpu_index: int
    gpu_uuid: str
    healthy: bool
    status: str
    reasons: list[str]
    observed_at: datetime
    lease_epoch: int = 0
    xid: int | None = None
    job_ids: list[str] = Field(default_factory=list)
    job_action: str | None = None


class ReconcileJobs(Payload):
    """Command to an agent: the jobs the store says run on this node (sent after a NodeRegistered).

    The agent stops processes of jobs not listed, and reports each listed job it does not have with a
    JobExitReported(reason_code=missing_after_restart). Ordered after every earlier StartJob of the node
    (same partition key), so a job listed here and not known to the agent is truly missing.
    """

    TYPE: ClassVar[str] = "ReconcileJobs"
    node_id: str
    job_ids: list[str]
    lease_epoch: int | None = None  # the epoch this answers; an agent ignores an answer to an older epoch


class ScaleOutRequested(Payload):
    """The metrics service asks an autoscaler for `nodes` more nodes of `gpu_model`, with its evidence."""

    TYPE: ClassVar[str] = "ScaleOutRequested"
    gpu_model: str
    nodes: int
    reason: str
    pending_gpus: int
    unplaceable_gpus: int
    free_gpus: int
    gpus_per_node: int
    in_flight_nodes: int
    pressure_since: datetime
    decided_at: datetime
    pool: str | None = None


class ScaleInRequested(Payload):
    """The metrics service asks an autoscaler to remove `node_id`, empty since `empty_since`."""

    TYPE: ClassVar[str] = "ScaleInRequested"
    node_id: str
    gpu_model: str
    reason: str
    empty_since: datetime
    idle_s: float
    nodes_of_model: int
    pending_gpus: int
    decided_at: datetime
    pool: str | None = None


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    model.TYPE: model
    for model in (
        JobSubmitted, JobAdmitted, JobRejected, QuotaDeferred, QuotaReserved, JobPlaced,
        PlacementDeferred, JobStarted, JobSucceeded, JobFailed, JobCancelled, JobRequeued, QuotaReleased,
        PreemptionRequested, VictimsSelected, JobCheckpointed, JobPreempted, PreemptJob, JobCheckpointReported,
        StartJob, StopJob, NodeRegistered, NodeHeartbeat, JobStartReported, JobExitReported,
        GpuTelemetry, GpuHealthChanged, ReconcileJobs, ScaleOutRequested, ScaleInRequested,
    )
}


class UnknownEventType(ValueError):
    pass


def parse_payload(envelope: Envelope) -> Payload:
    """The typed payload of an envelope; raises UnknownEventType or pydantic.ValidationError."""
    model = PAYLOAD_TYPES.get(envelope.type)
    if model is None:
        raise UnknownEventType(f"unknown event type {envelope.type!r}")
    if envelope.schema_version != model.SCHEMA_VERSION:
        raise UnknownEventType(
            f"{envelope.type} schema version {envelope.schema_version} is not supported "
            f"(this build reads version {model.SCHEMA_VERSION})"
        )
    return model.model_validate(envelope.payload)


def make_envelope(
    payload: Payload,
    *,
    event_id: str,
    stream_id: str,
    occurred_at: datetime,
    producer: str,
    stream_version: int | None = None,
    tenant: str | None = None,
    traceparent: str | None = None,
) -> Envelope:
    return Envelope(
        event_id=event_id,
        type=payload.TYPE,
        schema_version=payload.SCHEMA_VERSION,
        stream_id=stream_id,
        stream_version=stream_version,
        occurred_at=occurred_at,
        producer=producer,
        tenant=tenant,
        traceparent=traceparent,
        payload=payload.model_dump(mode="json"),
    )
