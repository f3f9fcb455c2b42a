"""What a node may tell the control plane (pure): its registration, heartbeats and reports are checked
before they reach the store, every reason at once. A registration that cannot describe a real node (GPU
indices that are not 0..n-1, a GPU with no memory, numbers no machine has) puts the node in quarantine
with the reasons: nothing is placed there, every other node goes on. A heartbeat or report with numbers
out of range is ignored and counted, never stored (a lease TTL of 1e14 s would overflow the lease loop)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpusched_common import events as ev
from gpusched_common.ids import is_valid_id

MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_MIB = 4 * 1024 * 1024  # 4 TiB
MAX_NODE_CPU_MILLI = 4096 * 1000  # 4,096 cores
MAX_NODE_MEMORY_MIB = 256 * 1024 * 1024  # 256 TiB
MAX_EPOCH = 2**62
MAX_LEASE_TTL_S = 3600.0
MAX_LABELS = 64
MAX_JOBS_REPORTED = 4096
MAX_TEXT = 256
MAX_URL = 2048
MAX_PID = 2**31 - 1


def _finite(value: float, low: float, high: float) -> bool:
    return math.isfinite(value) and low <= value <= high


def check_registration(node: ev.NodeRegistered) -> list[str]:
    """Every reason the registration cannot describe a real node (empty: it may)."""
    reasons = []
    if not is_valid_id(node.node_id):
        reasons.append(f"node id {node.node_id[:40]!r} is not a valid id")
    if not 0 < len(node.hostname) <= MAX_TEXT:
        reasons.append(f"hostname must be 1-{MAX_TEXT} characters")
    if not 0 <= node.lease_epoch <= MAX_EPOCH:
        reasons.append(f"lease epoch {node.lease_epoch} is outside 0..2^62")
    if not 0 <= node.cpu_milli <= MAX_NODE_CPU_MILLI:
        reasons.append(f"cpu_milli {node.cpu_milli} is outside 0..{MAX_NODE_CPU_MILLI}")
    if not 0 <= node.memory_mib <= MAX_NODE_MEMORY_MIB:
        reasons.append(f"memory_mib {node.memory_mib} is outside 0..{MAX_NODE_MEMORY_MIB}")
    if len(node.labels) > MAX_LABELS or any(len(k) > MAX_TEXT or len(v) > MAX_TEXT for k, v in node.labels.items()):
        reasons.append(f"labels: at most {MAX_LABELS}, each key and value at most {MAX_TEXT} characters")
    if node.log_url is not None and (len(node.log_url) > MAX_URL or not node.log_url.startswith(("http://", "https://"))):
        reasons.append("log_url must be an http(s) URL of at most 2048 characters")
    reasons.extend(_job_ids("running_jobs", node.running_jobs))
    reasons.extend(check_gpus(node.gpus))
    return reasons


def check_gpus(gpus: list[ev.GpuInventory]) -> list[str]:
    reasons = []
    if len(gpus) > MAX_GPUS_PER_NODE:
        return [f"{len(gpus)} GPUs; a node has at most {MAX_GPUS_PER_NODE}"]
    indices = [g.index for g in gpus]
    if sorted(indices) != list(range(len(gpus))):
        reasons.append(f"GPU indices {sorted(indices)[:10]} are not 0..{len(gpus) - 1}, each once")
    uuids = [g.uuid for g in gpus]
    if len(set(uuids)) != len(uuids) or any(not 0 < len(u) <= MAX_TEXT for u in uuids):
        reasons.append("GPU UUIDs must be distinct and 1-256 characters")
    for gpu in gpus:
        if not 0 < gpu.memory_mib <= MAX_GPU_MEMORY_MIB:
            reasons.append(f"GPU {gpu.index}: memory_mib {gpu.memory_mib} is outside 1..{MAX_GPU_MEMORY_MIB}")
        if not 0 < len(gpu.model) <= MAX_TEXT:
            reasons.append(f"GPU {gpu.index}: the model name must be 1-256 characters")
        if any(peer not in indices or peer == gpu.index for peer in gpu.nvlink_peers):
            reasons.append(f"GPU {gpu.index}: NVLink peers {gpu.nvlink_peers[:10]} are not other GPUs of the node")
        if len(gpu.mig_devices) > 8 or any(not 0 < m.memory_mib <= gpu.memory_mib for m in gpu.mig_devices):
            reasons.append(f"GPU {gpu.index}: at most 8 MIG devices, each with memory within the GPU's")
    return reasons


def check_heartbeat(beat: ev.NodeHeartbeat) -> list[str]:
    """Every reason to ignore the heartbeat (its lease numbers drive when a node is declared lost)."""
    reasons = []
    if not 0 <= beat.lease_epoch <= MAX_EPOCH:
        reasons.append(f"lease epoch {beat.lease_epoch} is outside 0..2^62")
    if not _finite(beat.lease_ttl_s, 0.0, MAX_LEASE_TTL_S):
        reasons.append(f"lease_ttl_s {beat.lease_ttl_s} is outside 0..{MAX_LEASE_TTL_S:g}")
    if not _finite(beat.fence_grace_s, 0.0, MAX_LEASE_TTL_S):
        reasons.append(f"fence_grace_s {beat.fence_grace_s} is outside 0..{MAX_LEASE_TTL_S:g}")
    if any(not 0 <= i < MAX_GPUS_PER_NODE for i in beat.unhealthy_gpus) or len(beat.unhealthy_gpus) > MAX_GPUS_PER_NODE:
        reasons.append("unhealthy_gpus are not GPU indices")
    reasons.extend(_job_ids("running_jobs", beat.running_jobs))
    return reasons


def check_report(report: ev.Payload) -> list[str]:
    """Every reason to ignore a job report or GPU health change of a node (numbers out of range)."""
    reasons = []
    epoch = getattr(report, "lease_epoch", None)
    if epoch is not None and not 0 <= epoch <= MAX_EPOCH:
        reasons.append(f"lease epoch {epoch} is outside 0..2^62")
    match report:
        case ev.JobStartReported():
            if not 0 <= report.pid <= MAX_PID:
                reasons.append(f"pid {report.pid} is outside 0..{MAX_PID}")
        case ev.JobExitReported():
            if not -(2**31) <= report.exit_code < 2**31:
                reasons.append(f"exit code {report.exit_code} is no process's")
            if not _finite(report.runtime_s, 0.0, 10 * 366 * 86400.0):
                reasons.append(f"runtime_s {report.runtime_s} is not a run time")
        case ev.GpuHealthChanged():
            if not 0 <= report.gpu_index < MAX_GPUS_PER_NODE:
                reasons.append(f"GPU index {report.gpu_index} is outside 0..{MAX_GPUS_PER_NODE - 1}")
        case ev.JobCheckpointReported():
            if len(report.checkpoint_ref) > 1024:
                reasons.append("a checkpoint reference is at most 1024 characters")
    return reasons


def _job_ids(field: str, job_ids: Iterable[str]) -> list[str]:
    ids = list(job_ids)
    if len(ids) > MAX_JOBS_REPORTED or not all(is_valid_id(i) for i in ids):
        return [f"{field}: at most {MAX_JOBS_REPORTED} valid job ids"]
    return []
