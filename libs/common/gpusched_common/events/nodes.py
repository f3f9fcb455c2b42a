"""Commands to node agents, and what agents report (registration, health, job reports, telemetry)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from gpusched_common.events.base import Frozen, Payload


# --- node commands and reports ---------------------------------------------------------------------


class StartJob(Payload):
    TYPE: ClassVar[str] = "StartJob"
    job_id: str
    node_id: str
    tenant: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    command: list[str]  # empty with an image: the image's entrypoint
    image: str | None = None  # run in a container of this image (the node has a runtime: its containers label)
    args: list[str] = Field(default_factory=list)  # with an image and no command: its entrypoint's arguments
    env: dict[str, str] = Field(default_factory=dict)
    attempt: int = 1  # which run of the job this is: a requeued or preempted job runs again
    # a fraction of one GPU (DESIGN.md section 5): enforced through MPS where the node runs it
    gpu_share_milli: int | None = None
    gpu_memory_mib: int | None = None
    # a MIG instance of this profile at memory slice mig_start of the (one) listed GPU; the agent finds or
    # creates it and gives the job its MIG device UUID
    mig_profile: str | None = None
    mig_start: int | None = None
    time_limit_s: float | None = None  # the agent stops the run after this long (JobSpec.time_limit_s)
    # the host CPU (milli-cores) and memory the job holds on this node: its cgroup's limits where the node
    # enforces them (0: no limit; NodeRegistered.isolation says what the node enforces)
    cpu_milli: int = Field(0, ge=0)
    host_memory_mib: int = Field(0, ge=0)
    # the fencing token: the node's lease epoch when placement placed the run; an agent at another epoch
    # (it restarted, or lost and regained its lease since) ignores the command (None: not fenced)
    lease_epoch: int | None = None


class PreemptJob(Payload):
    """To an agent: notify the job (SIGTERM and a notice file naming the deadline), SIGKILL it at the
    deadline if it has not exited, then report its exit with reason_code `preempted`."""

    TYPE: ClassVar[str] = "PreemptJob"
    job_id: str
    node_id: str
    grace_s: float
    deadline_at: datetime
    reason: str
    # the run to preempt (StartJob.attempt): another run of the job on the node is not touched (None: any)
    attempt: int | None = None


class JobCheckpointReported(Payload):
    """From an agent: the job wrote a new checkpoint reference to its checkpoint file."""

    TYPE: ClassVar[str] = "JobCheckpointReported"
    job_id: str
    node_id: str
    checkpoint_ref: str
    checkpointed_at: datetime
    lease_epoch: int | None = None
    attempt: int | None = None


class StopJob(Payload):
    TYPE: ClassVar[str] = "StopJob"
    job_id: str
    node_id: str
    reason: str
    # the run to stop (StartJob.attempt): an earlier run's StopJob, sent again or late, leaves a later run be
    # (None: whichever run the node has)
    attempt: int | None = None


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
    model: str  # canonical (gpusched_common.resources.canonical_model of the product and its memory)
    memory_mib: int
    mig_enabled: bool = False
    nvlink_domain: str | None = None
    mig_devices: list[MigDeviceInventory] = Field(default_factory=list)
    nvlink_peers: list[int] = Field(default_factory=list)  # indices of GPUs on this node joined by NVLink
    pci_bus_id: str | None = None
    healthy: bool = True
    product: str | None = None  # the product name as NVML gives it (e.g. "NVIDIA H100 NVL"; None: not reported)


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
    log_url: str | None = None  # where the gateway reads its jobs' logs (None: it serves none)
    # what the node enforces on each job (cpu, memory, devices, users, environment): how, or why not
    isolation: dict[str, str] = Field(default_factory=dict, max_length=16)


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
    attempt: int | None = None  # the run (StartJob.attempt) this reports; another run's report is ignored


class ExitReason(StrEnum):
    """Why a node agent ended or lost a job when it was not the job's own doing (``JobExitReported.reason_code``).
    The agent produces them (``gpusched_core.agent``), placement and the job's history read them; the
    values are part of the message format, so they never change."""

    LEASE_LOST = "lease_lost"  # the node's lease lapsed: the agent fenced the job (or refused to start it)
    NOT_ASSIGNED = "not_assigned"  # the store no longer expects the job on this node (never reported)
    MISSING_AFTER_RESTART = "missing_after_restart"  # the store expects a job the agent does not have: requeue
    GPU_UNHEALTHY = "gpu_unhealthy"  # a GPU of the job failed (or was already cordoned when it was to start)
    STOPPED = "stopped"  # a StopJob (e.g. the job was cancelled)
    PREEMPTED = "preempted"  # a PreemptJob: notice, grace period, then SIGKILL
    TIME_LIMIT = "time_limit"  # the run reached its time limit: SIGTERM, grace period, then SIGKILL


class JobExitReported(Payload):
    TYPE: ClassVar[str] = "JobExitReported"
    job_id: str
    node_id: str
    exit_code: int
    runtime_s: float
    error: str | None = None  # set when the command could not even be started
    lease_epoch: int | None = None
    reason_code: str | None = None  # an ExitReason: why the agent ended or lost the job, when not its own doing
    attempt: int | None = None  # the run this reports (None: the agent knows no run of it, e.g. missing)


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
    # each listed job's current run (its attempt): a StartJob the agent held runs only if it is of that run,
    # never one of an earlier run placed here before (None: not told, as before)
    attempts: dict[str, int] | None = None


class NodeLost(Payload):
    """Placement to a node it declared lost at ``lease_epoch`` (silent past its lease): the jobs it had are
    requeued elsewhere. An agent still at that epoch stops them and registers again with a new epoch (until
    then placement ignores its reports of that epoch), so a node that was only slow comes back."""

    TYPE: ClassVar[str] = "NodeLost"
    node_id: str
    lease_epoch: int
    reason: str
    # the lowest epoch the store accepts from the node now: epochs are the control plane's, kept in the
    # store, so an agent whose directory was wiped (it would count from 1 again) registers above every
    # epoch its node used before (None: any epoch above lease_epoch)
    next_epoch: int | None = Field(None, ge=1)


class NodeEnrolmentRequested(Payload):
    """A node asks to be enrolled with a key of its own (on ``gpusched.nodes.reports``, signed by that key:
    it holds the private half). An operator's join token vouches for it: ``token_signature`` is the token's
    signature over ``gpusched_common.node_keys.enrolment_message`` (the token's secret never travels).
    Placement decides it and answers ``NodeEnrolled`` or, to a holder of the token, ``NodeEnrolmentRefused``."""

    TYPE: ClassVar[str] = "NodeEnrolmentRequested"
    node_id: str = Field(max_length=128)
    key_id: str = Field(max_length=16)
    public_key: str = Field(max_length=64)  # urlsafe base64 of the 32-byte Ed25519 public key
    token_id: str = Field(max_length=16)
    token_signature: str = Field(max_length=128)


class NodeEnrolled(Payload):
    """Placement to a node: its key is enrolled; the node's reports signed with it are believed."""

    TYPE: ClassVar[str] = "NodeEnrolled"
    node_id: str
    key_id: str


class NodeEnrolmentRefused(Payload):
    """Placement to a node whose request its join token vouched for, but which was refused (the token
    expired or was revoked, or the node is enrolled with another key): why, for the agent's log."""

    TYPE: ClassVar[str] = "NodeEnrolmentRefused"
    node_id: str
    key_id: str
    reason: str


class CordonNode(Payload):
    """An operator's request, on ``gpusched.jobs.control`` keyed by the node id, to cordon (``cordon``) or
    uncordon a node. Only a producer that attests (the gateway, having authorized an operator) may send it;
    placement verifies it and records ``NodeCordoned``/``NodeUncordoned`` on the node's stream."""

    TYPE: ClassVar[str] = "CordonNode"
    node_id: str
    cordon: bool
    reason: str
    requested_by: str
    drain_grace_s: float | None = None  # with cordon: drain too, preempting its jobs with this grace period


class NodeCordoned(Payload):
    """No new work is placed on the node; what runs there goes on (or, draining, is preempted). Recorded by
    placement on the node's stream (its history, published nowhere) from a verified ``CordonNode``."""

    TYPE: ClassVar[str] = "NodeCordoned"
    node_id: str
    reason: str
    requested_by: str
    draining: bool = False  # its jobs are preempted through the checkpoint protocol, to resume elsewhere


class NodeUncordoned(Payload):
    """The node takes work again; recorded by placement like ``NodeCordoned``."""

    TYPE: ClassVar[str] = "NodeUncordoned"
    node_id: str
    requested_by: str
