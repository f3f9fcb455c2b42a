"""NVML backends: real GPUs through pynvml (nvidia-ml-py), or a simulated node with the same interface.

The simulated backend's utilization and memory follow the GPUs the agent marks busy, so that telemetry
and metrics behave like a real node running jobs.
"""

from __future__ import annotations

import hashlib
import os
import socket
import zlib
from dataclasses import dataclass
from typing import Protocol

from gpusched_common.events import GpuInventory, GpuSample
from gpusched_common.resources import canonical_model, model_memory_mib


@dataclass(frozen=True)
class NodeInfo:
    hostname: str
    gpus: tuple[GpuInventory, ...]
    cpu_milli: int
    memory_mib: int
    driver_version: str | None
    cuda_version: str | None
    backend: str


class NvmlBackend(Protocol):
    def node_info(self) -> NodeInfo: ...
    def sample(self) -> list[GpuSample]: ...
    def set_busy(self, gpu_indices: tuple[int, ...], busy: bool) -> None: ...
    def close(self) -> None: ...


def parse_gpu_spec(spec: str) -> list[tuple[str, int]]:
    """`H100-80GB:8` or `H100-80GB:4,L4-24GB:2` -> [(model, count), ...]; raises ValueError."""
    result = []
    for part in spec.split(","):
        model, _, count = part.strip().partition(":")
        canonical = canonical_model(model)
        if canonical is None:
            raise ValueError(f"unknown GPU model {model!r} in {spec!r}")
        n = int(count or "1")
        if not 0 < n <= 16:
            raise ValueError(f"GPU count {n} in {spec!r} is outside 1..16")
        result.append((canonical, n))
    return result


def _host_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


class SimulatedNvml:
    def __init__(self, node_id: str, spec: str) -> None:
        self._node_id = node_id
        gpus = []
        index = 0
        for model, count in parse_gpu_spec(spec):
            for _ in range(count):
                digest = hashlib.sha1(f"{node_id}/{index}".encode()).hexdigest()
                uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
                gpus.append(GpuInventory(index=index, uuid=uuid, model=model, memory_mib=model_memory_mib(model),
                                         nvlink_domain=f"{node_id}/nvswitch-0"))
                index += 1
        self._gpus = tuple(gpus)
        self._busy: set[int] = set()
        self._tick = 0

    def node_info(self) -> NodeInfo:
        return NodeInfo(hostname=f"sim-{self._node_id}", gpus=self._gpus, cpu_milli=len(self._gpus) * 16_000,
                        memory_mib=len(self._gpus) * 128 * 1024, driver_version="sim-560.35",
                        cuda_version="12.6", backend="simulated")

    def set_busy(self, gpu_indices: tuple[int, ...], busy: bool) -> None:
        if busy:
            self._busy.update(gpu_indices)
        else:
            self._busy.difference_update(gpu_indices)

    def sample(self) -> list[GpuSample]:
        self._tick += 1
        samples = []
        for gpu in self._gpus:
            busy = gpu.index in self._busy
            # deterministic jitter so that graphs look alive without randomness
            jitter = (zlib.crc32(f"{self._node_id}/{gpu.index}/{self._tick}".encode()) % 1000) / 1000.0
            util = 80.0 + 20.0 * jitter if busy else 0.0
            samples.append(GpuSample(
                index=gpu.index, uuid=gpu.uuid, utilization_pct=round(util, 1),
                memory_used_mib=int(gpu.memory_mib * (0.6 + 0.3 * jitter)) if busy else 0,
                memory_total_mib=gpu.memory_mib, power_w=round(350.0 + 300.0 * jitter if busy else 70.0, 1),
                temperature_c=round(60.0 + 15.0 * jitter if busy else 32.0, 1),
                sm_clock_mhz=1980 if busy else 345,
            ))
        return samples

    def close(self) -> None:
        return None


class RealNvml:
    """NVML through pynvml. Only constructed on a machine with the NVIDIA driver."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def node_info(self) -> NodeInfo:
        nv = self._nvml
        gpus = []
        for index, handle in enumerate(self._handles):
            name = nv.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = nv.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            memory_mib = nv.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            try:
                mig_enabled = nv.nvmlDeviceGetMigMode(handle)[0] == nv.NVML_DEVICE_MIG_ENABLE
            except nv.NVMLError:
                mig_enabled = False
            gpus.append(GpuInventory(index=index, uuid=uuid, model=canonical_model(name) or name.replace(" ", "-"),
                                     memory_mib=memory_mib, mig_enabled=mig_enabled))
        driver = nv.nvmlSystemGetDriverVersion()
        cuda = nv.nvmlSystemGetCudaDriverVersion_v2()
        return NodeInfo(hostname=socket.gethostname(), gpus=tuple(gpus), cpu_milli=(os.cpu_count() or 1) * 1000,
                        memory_mib=_host_memory_mib(),
                        driver_version=driver.decode() if isinstance(driver, bytes) else driver,
                        cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}", backend="nvml")

    def set_busy(self, gpu_indices: tuple[int, ...], busy: bool) -> None:
        return None  # real GPUs report what the jobs actually do

    def sample(self) -> list[GpuSample]:
        nv = self._nvml
        samples = []
        for index, handle in enumerate(self._handles):
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            uuid = nv.nvmlDeviceGetUUID(handle)
            samples.append(GpuSample(
                index=index, uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                utilization_pct=float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
                memory_used_mib=memory.used // (1024 * 1024), memory_total_mib=memory.total // (1024 * 1024),
                power_w=nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                temperature_c=float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
                sm_clock_mhz=int(nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
            ))
        return samples

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def make_backend(kind: str, node_id: str, simulated_gpus: str) -> NvmlBackend:
    if kind == "real":
        return RealNvml()
    return SimulatedNvml(node_id, simulated_gpus)
