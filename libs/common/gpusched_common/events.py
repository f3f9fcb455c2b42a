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


class JobAdmitted(Payload):
    TYPE: ClassVar[str] = "JobAdmitted"
    job_id: str
    spec: JobSpec
    submitted_at: datetime


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


class StopJob(Payload):
    TYPE: ClassVar[str] = "StopJob"
    job_id: str
    node_id: str
    reason: str


class GpuInventory(Frozen):
    index: int
    uuid: str
    model: str
    memory_mib: int
    mig_enabled: bool = False
    nvlink_domain: str | None = None


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


class NodeHeartbeat(Payload):
    TYPE: ClassVar[str] = "NodeHeartbeat"
    node_id: str
    running_jobs: list[str]


class JobStartReported(Payload):
    TYPE: ClassVar[str] = "JobStartReported"
    job_id: str
    node_id: str
    pid: int
    started_at: datetime


class JobExitReported(Payload):
    TYPE: ClassVar[str] = "JobExitReported"
    job_id: str
    node_id: str
    exit_code: int
    runtime_s: float
    error: str | None = None  # set when the command could not even be started


class GpuSample(Frozen):
    index: int
    uuid: str
    utilization_pct: float
    memory_used_mib: int
    memory_total_mib: int
    power_w: float
    temperature_c: float
    sm_clock_mhz: int


class GpuTelemetry(Payload):
    TYPE: ClassVar[str] = "GpuTelemetry"
    node_id: str
    sampled_at: datetime
    samples: list[GpuSample]


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    model.TYPE: model
    for model in (
        JobSubmitted, JobAdmitted, JobRejected, QuotaDeferred, QuotaReserved, JobPlaced,
        PlacementDeferred, JobStarted, JobSucceeded, JobFailed, JobCancelled, QuotaReleased,
        StartJob, StopJob, NodeRegistered, NodeHeartbeat, JobStartReported, JobExitReported,
        GpuTelemetry,
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
