"""The commands a job's lifecycle accepts, one frozen dataclass each, and their union `Command`. A
command says what a service wants to happen; `decide` answers with the events it produces, if any."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpusched_common import events as ev


@dataclass(frozen=True)
class RegisterSubmission:
    spec: ev.JobSpec | None
    submitted_at: datetime
    rejection_reasons: tuple[str, ...] = ()
    tenant_hint: str | None = None  # for a submission whose spec could not be parsed
    request_id: str | None = None
    submitted_by: str | None = None  # who submitted: the attested principal, the producer, or the key id
    producer: str | None = None  # the producer credential that signed it (None: a tenant keys file key)
    hold: bool = False  # admitted held


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
    requested_by: str | None = None  # who asked (an attested principal), recorded with the cancellation


@dataclass(frozen=True)
class Hold:
    reason: str
    requested_by: str | None = None


@dataclass(frozen=True)
class Release:
    requested_by: str | None = None


# every command `decide` accepts; adding one here needs a handler in decisions.HANDLERS (a test checks)
Command = (
    RegisterSubmission | DeferQuota | ReserveQuota | Place | DeferPlacement | RecordStart | RecordExit
    | Requeue | RequestPreemption | SelectVictims | RecordCheckpoint | ReleaseQuota | Cancel
    | Hold | Release
)
