"""What an NVML backend reports, as plain frozen values, and the pure helpers that shape them.

Backends (real NVML or simulated) produce these; the agent turns them into reports. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_common.events import GpuInventory, GpuProcessSample, GpuSample, MigDeviceInventory

# Throttle reasons as NVML names them (nvmlClocksEventReason*), in our spelling.
THERMAL_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake_slowdown"})
HW_SLOWDOWN = "hw_slowdown"


@dataclass(frozen=True)
class NodeInfo:
    hostname: str
    gpus: tuple[GpuInventory, ...]
    cpu_milli: int
    memory_mib: int
    driver_version: str | None
    cuda_version: str | None
    backend: str


@dataclass(frozen=True)
class HealthObservation:
    """One GPU's health signals since the previous observation.

    `reachable` is False when the GPU fell off the bus (NVML answers GPU_IS_LOST); `xids` are the XID
    errors raised since the last observation; `ecc_uncorrected` is the volatile uncorrected ECC count
    (None where the GPU has no ECC); `throttle_reasons` use the names in this module.
    """

    index: int
    uuid: str
    reachable: bool = True
    xids: tuple[int, ...] = ()
    ecc_uncorrected: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    temperature_c: float | None = None


def parse_labels(text: str) -> dict[str, str]:
    """`rack=r1, gpusched.io/pool=train` -> {"rack": "r1", "gpusched.io/pool": "train"}; raises ValueError."""
    labels: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"label {part!r} is not KEY=VALUE")
        labels[key.strip()] = value.strip()
    return labels


def nvlink_domains(node_id: str, peers: Mapping[int, Iterable[int]], switched: bool = False) -> dict[int, str]:
    """NVLink domain of each GPU: the connected components of the NVLink peer graph.

    With an NVSwitch every GPU reaches every other, so all GPUs share one domain. A GPU without NVLink
    peers forms no domain and is absent from the result.
    """
    if switched:
        return {index: f"{node_id}/nvswitch-0" for index in sorted(peers)}
    parent = {index: index for index in peers}
    for index, linked in peers.items():
        for other in linked:
            parent.setdefault(other, other)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for index, linked in peers.items():
        for other in linked:
            a, b = root(index), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    members: dict[int, list[int]] = {}
    for index in parent:
        members.setdefault(root(index), []).append(index)
    domains: dict[int, str] = {}
    for first, group in members.items():
        if len(group) > 1:
            for index in group:
                domains[index] = f"{node_id}/nvlink-{first}"
    return domains


def attribute_processes(samples: list[GpuSample], job_of_pid: Mapping[int, str]) -> list[GpuSample]:
    """Name the job of every GPU process whose pid (or process group) a job of this agent owns."""
    out = []
    for sample in samples:
        if not sample.processes:
            out.append(sample)
            continue
        processes = [GpuProcessSample(pid=p.pid, memory_used_mib=p.memory_used_mib,
                                      job_id=p.job_id or job_of_pid.get(p.pid)) for p in sample.processes]
        out.append(sample.model_copy(update={"processes": processes}))
    return out


def mig_device_slices(device: MigDeviceInventory, slice_mib: int) -> range:
    """The memory slices a MIG device occupies (from its start and its memory)."""
    start = device.start_slice or 0
    return range(start, start + max(1, round(device.memory_mib / max(1, slice_mib))))


def pick_mig_device(devices: Iterable[MigDeviceInventory], profile: str, start: int | None,
                    busy: Iterable[str]) -> MigDeviceInventory | None:
    """A free MIG device of ``profile`` at memory slice ``start`` (any start when the device's own is
    unknown, as NVML reports it only through the GPU instance), or None."""
    taken = set(busy)
    for device in devices:
        if device.profile == profile and device.uuid not in taken and \
                (start is None or device.start_slice is None or device.start_slice == start):
            return device
    return None
