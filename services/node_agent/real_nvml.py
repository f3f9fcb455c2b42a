"""The NVML backend on real NVIDIA GPUs, through pynvml (nvidia-ml-py).

Constructed only on a machine with the NVIDIA driver; `RealNvml()` raises `NvmlUnavailable` elsewhere.
Optional features (MIG, NVLink, ECC, XID events) that a GPU or driver lacks are skipped, not fatal.
"""

from __future__ import annotations

from pathlib import Path

import os
import socket
from collections.abc import Callable
from typing import TypeVar

from gpusched_common.events import GpuInventory, GpuProcessSample, GpuSample, MigDeviceInventory
from gpusched_common.resources import canonical_model

from services.node_agent.faults import Fault
from gpusched_core.placement.mig import mig_profile_name
from services.node_agent.inventory import HealthObservation, NodeInfo, nvlink_domains, pick_mig_device

T = TypeVar("T")


def reported_model(product: str, memory_mib: int) -> str:
    """The canonical model of a GPU NVML names ``product`` with ``memory_mib`` (``canonical_model``); a name
    the rule cannot read is reported as NVML gives it, spaces as dashes (as GPU feature discovery does)."""
    return canonical_model(product, memory_mib) or "-".join(product.split()) or "unknown"


class NvmlUnavailable(RuntimeError):
    """No NVIDIA driver or no GPU on this machine."""


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def host_memory_mib() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0


class RealNvml:
    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml
        self._mig_jobs: dict[str, str] = {}  # job -> the MIG device UUID it runs on
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML is not available: {exc}") from exc
        if count == 0:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable("NVML found no GPU")
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        self._lost: set[int] = set()
        self._events = self._register_xid_events()

    def _try(self, fn: Callable[[], T], default: T) -> T:
        try:
            return fn()
        except self._nv.NVMLError_GpuIsLost:
            raise
        except self._nv.NVMLError:
            return default

    def _register_xid_events(self):
        nv = self._nv
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return None
        for handle in self._handles:
            self._try(lambda h=handle: nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events), None)
        return events

    # --- inventory ----------------------------------------------------------------------------------

    def node_info(self) -> NodeInfo:
        nv = self._nv
        bus_ids = [_text(self._try(lambda h=h: nv.nvmlDeviceGetPciInfo(h).busId, "")) for h in self._handles]
        peers, switched = self._nvlink_peers(bus_ids)
        domains = nvlink_domains("local", peers, switched)
        gpus = []
        for index, handle in enumerate(self._handles):
            name = _text(nv.nvmlDeviceGetName(handle))
            memory_mib = nv.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            model = reported_model(name, memory_mib)
            mig_enabled = self._try(lambda: nv.nvmlDeviceGetMigMode(handle)[0] == nv.NVML_DEVICE_MIG_ENABLE, False)
            gpus.append(GpuInventory(
                index=index, uuid=self._uuids[index], model=model, product=name, memory_mib=memory_mib,
                mig_enabled=mig_enabled, mig_devices=self._mig_devices(handle, model) if mig_enabled else [],
                nvlink_domain=domains.get(index), nvlink_peers=sorted(peers.get(index, ())),
                pci_bus_id=bus_ids[index] or None, healthy=index not in self._lost))
        cuda = self._try(nv.nvmlSystemGetCudaDriverVersion_v2, 0)
        return NodeInfo(hostname=socket.gethostname(), gpus=tuple(gpus), cpu_milli=(os.cpu_count() or 1) * 1000,
                        memory_mib=host_memory_mib(), driver_version=_text(nv.nvmlSystemGetDriverVersion()),
                        cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None, backend=self.name)

    def _nvlink_peers(self, bus_ids: list[str]) -> tuple[dict[int, set[int]], bool]:
        nv = self._nv
        by_bus = {bus.lower(): i for i, bus in enumerate(bus_ids) if bus}
        peers: dict[int, set[int]] = {}
        switched = False
        for index, handle in enumerate(self._handles):
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                if self._try(lambda: nv.nvmlDeviceGetNvLinkState(handle, link), 0) != nv.NVML_FEATURE_ENABLED:
                    continue
                kind = self._try(lambda: nv.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link), None)
                if kind == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                    switched = True
                remote = _text(self._try(lambda: nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId, ""))
                peers.setdefault(index, set())
                if remote.lower() in by_bus and by_bus[remote.lower()] != index:
                    peers[index].add(by_bus[remote.lower()])
        if switched:
            peers = {i: {j for j in peers if j != i} for i in peers}
        return peers, switched

    def _mig_devices(self, handle, model: str | None) -> list[MigDeviceInventory]:
        nv = self._nv
        devices = []
        for slot in range(self._try(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(handle), 0)):
            mig = self._try(lambda s=slot: nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, s), None)
            if mig is None:
                continue
            attrs = self._try(lambda: nv.nvmlDeviceGetAttributes_v2(mig), None)
            memory_mib = nv.nvmlDeviceGetMemoryInfo(mig).total // (1024 * 1024)
            slices = attrs.gpuInstanceSliceCount if attrs is not None else 0
            devices.append(MigDeviceInventory(
                uuid=_text(nv.nvmlDeviceGetUUID(mig)), profile=mig_profile_name(slices, memory_mib, model),
                gpu_instance_id=self._try(lambda: nv.nvmlDeviceGetGpuInstanceId(mig), slot), memory_mib=memory_mib))
        return devices

    # --- telemetry ----------------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        return [self._sample(index, handle) for index, handle in enumerate(self._handles)]

    def _sample(self, index: int, handle) -> GpuSample:
        nv = self._nv
        try:
            memory = nv.nvmlDeviceGetMemoryInfo(handle)
            processes = [GpuProcessSample(pid=p.pid, memory_used_mib=(p.usedGpuMemory or 0) // (1024 * 1024))
                         for p in self._try(lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle), [])]
            reasons = self._try(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle), 0)
            return GpuSample(
                index=index, uuid=self._uuids[index],
                utilization_pct=float(self._try(lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu, 0)),
                memory_used_mib=memory.used // (1024 * 1024), memory_total_mib=memory.total // (1024 * 1024),
                power_w=self._try(lambda: nv.nvmlDeviceGetPowerUsage(handle), 0) / 1000.0,
                temperature_c=float(self._try(lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU), 0)),
                sm_clock_mhz=int(self._try(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM), 0)),
                processes=processes, throttle_reasons=self._reason_names(reasons), healthy=index not in self._lost)
        except nv.NVMLError_GpuIsLost:
            self._lost.add(index)
            return GpuSample(index=index, uuid=self._uuids[index], utilization_pct=0.0, memory_used_mib=0,
                             memory_total_mib=0, power_w=0.0, temperature_c=0.0, sm_clock_mhz=0, healthy=False)

    def _reason_names(self, mask: int) -> list[str]:
        nv = self._nv
        names = {
            "sw_power_cap": nv.nvmlClocksEventReasonSwPowerCap,
            "hw_slowdown": nv.nvmlClocksEventReasonHwSlowdown,
            "sw_thermal_slowdown": nv.nvmlClocksEventReasonSwThermalSlowdown,
            "hw_thermal_slowdown": nv.nvmlClocksEventReasonHwThermalSlowdown,
            "hw_power_brake_slowdown": nv.nvmlClocksEventReasonHwPowerBrakeSlowdown,
        }
        return sorted(name for name, bit in names.items() if mask & bit)

    # --- health -------------------------------------------------------------------------------------

    def health(self) -> list[HealthObservation]:
        nv = self._nv
        xids = self._drain_xids()
        out = []
        for index, handle in enumerate(self._handles):
            try:
                ecc = self._try(lambda: nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC), None)
                reasons = self._reason_names(self._try(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle), 0))
                temperature = float(self._try(lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU), 0))
                reachable = index not in self._lost
            except nv.NVMLError_GpuIsLost:
                self._lost.add(index)
                ecc, reasons, temperature, reachable = None, [], None, False
            out.append(HealthObservation(index=index, uuid=self._uuids[index], reachable=reachable,
                                         xids=tuple(xids.get(index, ())), ecc_uncorrected=ecc,
                                         throttle_reasons=tuple(reasons), temperature_c=temperature))
        return out

    def _drain_xids(self) -> dict[int, list[int]]:
        """XID events raised since the last call (non-blocking)."""
        nv = self._nv
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        by_uuid = {uuid: i for i, uuid in enumerate(self._uuids)}
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # Timeout: nothing pending
                return found
            uuid = _text(self._try(lambda: nv.nvmlDeviceGetUUID(data.device), ""))
            if uuid in by_uuid:
                found.setdefault(by_uuid[uuid], []).append(int(data.eventData))

    # --- jobs: real GPUs show what the jobs actually do ----------------------------------------------

    def attach(self, job_id: str, gpu_indices: tuple[int, ...], pid: int, share_milli: int | None = None,
               memory_mib: int | None = None) -> None:
        return None

    def detach(self, job_id: str) -> None:
        self._mig_jobs.pop(job_id, None)

    def mig_device_for(self, job_id: str, gpu_index: int, profile: str, start: int) -> str:
        """A free MIG instance of ``profile`` that exists on the GPU (created by the operator's MIG manager).
        Creating instances on demand needs root and is not done here; raises ValueError with the reason."""
        gpu = next((g for g in self.node_info().gpus if g.index == gpu_index), None)
        if gpu is None or not gpu.mig_enabled:
            raise ValueError(f"GPU {gpu_index} is not in MIG mode")
        busy = {uuid for job, uuid in self._mig_jobs.items() if job != job_id}
        found = pick_mig_device(gpu.mig_devices, profile, start, busy)
        if found is None:
            raise ValueError(f"no free MIG {profile} instance on GPU {gpu_index}; create one with the MIG manager "
                             f"(nvidia-smi mig -cgi {profile} -C)")
        self._mig_jobs[job_id] = found.uuid
        return found.uuid

    def device_minors(self) -> dict[int, int]:
        """NVML's minor number of each GPU (its ``/dev/nvidia<minor>``), where the device file exists."""
        minors = {}
        for index, handle in enumerate(self._handles):
            minor = self._try(lambda h=handle: int(self._nv.nvmlDeviceGetMinorNumber(h)), -1)
            if minor >= 0 and Path(f"/dev/nvidia{minor}").exists():
                minors[index] = minor
        return minors

    def inject(self, fault: Fault) -> None:
        raise ValueError("faults can only be injected into the simulated backend")

    def close(self) -> None:
        if self._events is not None:
            self._try(lambda: self._nv.nvmlEventSetFree(self._events), None)
        self._nv.nvmlShutdown()
