"""Event envelope and payload models: the contract between services (DESIGN.md section 3).

Every message on the bus is an `Envelope` whose `payload` validates against the model registered for
its `type`. Models are frozen and forbid unknown fields; each carries its own schema version so that
readers can upcast old versions later. Job stream events are in `jobs`, node commands and reports in
`nodes`, scale decisions in `scaling`; import them all from here.
"""

from __future__ import annotations

from datetime import datetime

from gpusched_common.events.base import (
    Frozen, Payload, Envelope,
)
from gpusched_common.events.jobs import (
    ArrayTask, Dependency, GpuShareSpec, GangMember, GangMemberExited, JobSpec, JobSubmitted, JobAdmitted, JobRejected, QuotaDeferred, QuotaReserved, JobPlaced,
    PlacementDeferred, JobStarted, JobSucceeded, JobFailed, JobCancelled, JobCancelRequested, CancelJob, JobHeld, JobReleased, HoldJob, ReleaseJob,
    PreemptionRequested,
    VictimsSelected, JobCheckpointed, JobPreempted, JobRequeued, QuotaReleased,
)
from gpusched_common.events.nodes import (
    StartJob, PreemptJob, JobCheckpointReported, StopJob, MigDeviceInventory, GpuInventory, NodeRegistered,
    NodeHeartbeat, JobStartReported, JobExitReported, GpuProcessSample, GpuSample, GpuTelemetry,
    GpuHealthChanged, ReconcileJobs, ExitReason, CordonNode, NodeCordoned, NodeUncordoned,
    NodeEnrolmentRequested, NodeEnrolled, NodeEnrolmentRefused, NodeLost,
)
from gpusched_common.events.scaling import (
    ScaleOutRequested, ScaleInRequested, ReclaimBorrower, ReclaimRequested,
)
from gpusched_common.events.tenancy import TenancyUpdated


PAYLOAD_TYPES: dict[str, type[Payload]] = {
    model.TYPE: model
    for model in (
        JobSubmitted, JobAdmitted, JobRejected, QuotaDeferred, QuotaReserved, JobPlaced, GangMemberExited,
        PlacementDeferred, JobStarted, JobSucceeded, JobFailed, JobCancelled, JobCancelRequested, CancelJob,
        JobHeld, JobReleased, HoldJob, ReleaseJob, JobRequeued, QuotaReleased,
        PreemptionRequested, VictimsSelected, JobCheckpointed, JobPreempted, PreemptJob, JobCheckpointReported,
        StartJob, StopJob, NodeRegistered, NodeHeartbeat, JobStartReported, JobExitReported,
        GpuTelemetry, GpuHealthChanged, ReconcileJobs, CordonNode, NodeCordoned, NodeUncordoned, ScaleOutRequested, ScaleInRequested,
        ReclaimRequested, TenancyUpdated, NodeEnrolmentRequested, NodeEnrolled, NodeEnrolmentRefused, NodeLost,
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


__all__ = [  # the events package is the one place to import event models from
    "ArrayTask", "Dependency", "Envelope", "ExitReason", "Frozen", "GangMember", "GangMemberExited", "GpuHealthChanged", "GpuShareSpec", "GpuInventory", "GpuProcessSample", "GpuSample",
    "GpuTelemetry", "JobAdmitted", "JobCancelled", "JobCancelRequested", "CancelJob", "CordonNode", "NodeCordoned", "NodeUncordoned", "JobHeld", "JobReleased", "HoldJob", "ReleaseJob", "JobCheckpointReported", "JobCheckpointed",
    "JobExitReported", "JobFailed", "JobPlaced", "JobPreempted", "JobRejected", "JobRequeued", "JobSpec",
    "JobStartReported", "JobStarted", "JobSubmitted", "JobSucceeded", "MigDeviceInventory", "NodeHeartbeat",
    "NodeRegistered", "PAYLOAD_TYPES", "Payload", "PlacementDeferred", "PreemptJob", "PreemptionRequested",
    "QuotaDeferred", "QuotaReleased", "QuotaReserved", "ReclaimBorrower", "ReclaimRequested", "ReconcileJobs", "ScaleInRequested",
    "ScaleOutRequested", "StartJob", "StopJob", "TenancyUpdated", "UnknownEventType", "VictimsSelected", "make_envelope",
    "parse_payload",
]
