"""A simulated NVML node: configurable GPU models and MIG layouts, load that follows the jobs it runs,
and injectable faults (XID, ECC, throttling, falling off the bus). Deterministic: no randomness.

GPU spec: `MODEL:COUNT[:mig=PROFILE+PROFILE...][:mem=MIB]`, comma-separated, e.g.
`A100-80GB:2:mig=3g.40gb+2g.20gb+1g.10gb,H100-80GB:6` or `NVIDIA B200:8:mem=183359`. MODEL is a canonical
name or a product name as NVML gives it (reported as the GPU's product); its memory is `mem=` or, where the
name has a memory class, that class; the model reported is the normaliser's (``canonical_model``).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field

from gpusched_common.events import GpuInventory, GpuProcessSample, GpuSample, MigDeviceInventory
from gpusched_common.resources import canonical_model, model_memory_class_mib

from gpusched_core.placement.mig import MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, memory_slices_of, mig_family
from services.node_agent.faults import Fault
from services.node_agent.inventory import HealthObservation, NodeInfo, mig_device_slices, pick_mig_device


@dataclass(frozen=True)
class GpuGroup:
    model: str  # canonical (``canonical_model`` of the product and its memory)
    count: int
    mig_profiles: tuple[str, ...] = ()
    mig_mode: bool = False  # MIG enabled; instances beyond mig_profiles are created when jobs need them
    memory_mib: int = 0  # what the simulated NVML reports (0: the model's class)
    product: str | None = None  # the product name as NVML would give it: the spec's (None: the model)


def parse_gpu_spec(spec: str) -> list[GpuGroup]:
    """`H100-80GB:8`, `A100-80GB:2:mig=3g.40gb+3g.40gb,L4-24GB:2` (fixed MIG instances),
    `A100-80GB:4:mig` (MIG mode, instances created for each job) or `NVIDIA H100 NVL:2:mem=95830` -> groups;
    raises ValueError."""
    groups = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        product = fields[0].strip()
        count = int(fields[1]) if len(fields) > 1 and fields[1] else 1
        if not 0 < count <= 16:
            raise ValueError(f"GPU count {count} in {spec!r} is outside 1..16")
        profiles: tuple[str, ...] = ()
        mig_mode = False
        memory = model_memory_class_mib(product) or 0
        for extra in fields[2:]:
            key, _, value = extra.partition("=")
            if key == "mem" and value.strip().isdigit() and int(value) > 0:
                memory = int(value)
            elif key == "mig":
                mig_mode = True
                profiles = tuple(p.strip().lower() for p in value.split("+") if p.strip())
            else:
                raise ValueError(f"unknown option {extra!r} in {spec!r} (expected mig, mig=PROFILE+PROFILE or mem=MIB)")
        model = canonical_model(product, memory or None)
        if model is None:
            raise ValueError(f"unknown GPU model {product!r} in {spec!r}: it is no GPU model name")
        if not memory:
            raise ValueError(f"unknown GPU model {product!r} in {spec!r}: its name has no memory class; give the "
                             f"memory NVML would report, in MiB ({product}:{count}:mem=81920), or a name with one "
                             f"({model}-80GB)")
        if mig_mode and mig_family(model) is None:
            raise ValueError(f"{model} does not support MIG")
        if profiles:
            mig_layout(model, profiles)  # validates
        groups.append(GpuGroup(model, count, profiles, mig_mode, memory, product))
    return groups


def mig_layout(model: str, profiles: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(profile, start memory slice, memory slices) for each profile, placed largest first; raises ValueError."""
    family = mig_family(model)
    if family is None:
        raise ValueError(f"{model} does not support MIG")
    sized = []
    for profile in profiles:
        slices = memory_slices_of(family, profile)
        if slices is None:
            raise ValueError(f"MIG profile {profile!r} does not exist on a {model}")
        sized.append((profile, int(profile.split("g.")[0]), slices))
    if sum(c for _, c, _ in sized) > MIG_COMPUTE_SLICES:
        raise ValueError(f"MIG layout {'+'.join(profiles)} needs more than {MIG_COMPUTE_SLICES} compute slices")
    used = [False] * MIG_MEMORY_SLICES
    placed = []
    for profile, _, mem in sorted(sized, key=lambda s: (-s[2], s[0])):
        align = 1 if mem == 1 else min(mem, 4)
        start = next((s for s in range(0, MIG_MEMORY_SLICES - mem + 1, align) if not any(used[s:s + mem])), None)
        if start is None:
            raise ValueError(f"MIG layout {'+'.join(profiles)} does not fit the {MIG_MEMORY_SLICES} memory slices of {model}")
        used[start:start + mem] = [True] * mem
        placed.append((profile, start, mem))
    return sorted(placed, key=lambda p: p[1])


def _uuid(prefix: str, seed: str) -> str:
    d = hashlib.sha1(seed.encode()).hexdigest()
    return f"{prefix}-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"


@dataclass
class _GpuFaults:
    xids: list[int] = field(default_factory=list)
    ecc_uncorrected: int = 0
    throttle: set[str] = field(default_factory=set)
    lost: bool = False


@dataclass(frozen=True)
class _Load:
    gpu_indices: tuple[int, ...]
    pid: int
    share_milli: int
    memory_mib: int | None


class SimulatedNvml:
    name = "simulated"

    def __init__(self, node_id: str, spec: str) -> None:
        self._node_id = node_id
        gpus = []
        for group in parse_gpu_spec(spec):
            for _ in range(group.count):
                index = len(gpus)
                gpus.append(self._gpu(index, group))
        self._gpus = tuple(gpus)
        self._faults = {g.index: _GpuFaults() for g in self._gpus}
        self._loads: dict[str, _Load] = {}
        self._mig_jobs: dict[str, str] = {}  # job -> the MIG device UUID it runs on
        self._tick = 0

    def _gpu(self, index: int, group: GpuGroup) -> GpuInventory:
        seed = f"{self._node_id}/{index}"
        memory = group.memory_mib
        mig = []
        if group.mig_profiles:
            for gi, (profile, start, mem) in enumerate(mig_layout(group.model, group.mig_profiles)):
                mig.append(MigDeviceInventory(uuid=_uuid("MIG", f"{seed}/{gi}"), profile=profile,
                                              gpu_instance_id=gi + 1, start_slice=start,
                                              memory_mib=memory * mem // MIG_MEMORY_SLICES))
        return GpuInventory(index=index, uuid=_uuid("GPU", seed), model=group.model, memory_mib=memory,
                            product=group.product or group.model,
                            mig_enabled=group.mig_mode, mig_devices=mig, nvlink_domain=f"{self._node_id}/nvswitch-0",
                            pci_bus_id=f"00000000:{0x10 + index:02X}:00.0")

    def node_info(self) -> NodeInfo:
        gpus = tuple(g.model_copy(update={"healthy": not self._faults[g.index].lost}) for g in self._gpus)
        peers = {g.index: [o.index for o in self._gpus if o.index != g.index] for g in self._gpus}
        gpus = tuple(g.model_copy(update={"nvlink_peers": peers[g.index]}) for g in gpus)
        return NodeInfo(hostname=f"sim-{self._node_id}", gpus=gpus, cpu_milli=max(1, len(gpus)) * 16_000,
                        memory_mib=max(1, len(gpus)) * 128 * 1024, driver_version="sim-560.35.03",
                        cuda_version="12.6", backend=self.name)

    # --- load that follows jobs ---------------------------------------------------------------------

    def attach(self, job_id: str, gpu_indices: tuple[int, ...], pid: int, share_milli: int | None = None,
               memory_mib: int | None = None) -> None:
        self._loads[job_id] = _Load(tuple(gpu_indices), pid, share_milli or 1000, memory_mib)

    def detach(self, job_id: str) -> None:
        self._loads.pop(job_id, None)
        self._mig_jobs.pop(job_id, None)

    def mig_device_for(self, job_id: str, gpu_index: int, profile: str, start: int) -> str:
        """The MIG device a job runs on: a free instance of ``profile`` at slice ``start``, else one created
        there (what a dynamic MIG manager does with nvidia-smi mig -cgi/-cci; idle instances in the way are
        destroyed first). Raises ValueError with the reason when neither is possible."""
        gpu = self._gpus[gpu_index]
        if not gpu.mig_enabled:
            raise ValueError(f"GPU {gpu_index} is not in MIG mode")
        busy = {uuid for job, uuid in self._mig_jobs.items() if job != job_id}
        found = pick_mig_device(gpu.mig_devices, profile, start, busy)
        if found is None:
            found = self._create_mig_device(gpu, profile, start, busy)
        self._mig_jobs[job_id] = found.uuid
        return found.uuid

    def _create_mig_device(self, gpu: GpuInventory, profile: str, start: int, busy: set[str]) -> MigDeviceInventory:
        slice_mib = gpu.memory_mib // MIG_MEMORY_SLICES
        family = mig_family(gpu.model)
        size = memory_slices_of(family, profile) if family is not None else None
        if size is None:
            raise ValueError(f"MIG profile {profile!r} does not exist on a {gpu.model}")
        if start + size > MIG_MEMORY_SLICES:
            raise ValueError(f"MIG {profile} does not fit at memory slice {start}")
        wanted = set(range(start, start + size))
        in_the_way = [d for d in gpu.mig_devices if wanted & set(mig_device_slices(d, slice_mib))]
        if any(d.uuid in busy for d in in_the_way):
            raise ValueError(f"memory slices {sorted(wanted)} of GPU {gpu.index} are held by a running MIG instance")
        kept = [d for d in gpu.mig_devices if d not in in_the_way]
        device = MigDeviceInventory(uuid=_uuid("MIG", f"{self._node_id}/{gpu.index}/{profile}@{start}"),
                                    profile=profile, start_slice=start, memory_mib=slice_mib * size,
                                    gpu_instance_id=max((d.gpu_instance_id for d in kept), default=0) + 1)
        devices = sorted([*kept, device], key=lambda d: d.start_slice or 0)
        self._gpus = tuple(g.model_copy(update={"mig_devices": devices}) if g.index == gpu.index else g
                           for g in self._gpus)
        return device

    def sample(self) -> list[GpuSample]:
        self._tick += 1
        return [self._sample(gpu) for gpu in self._gpus]

    def _sample(self, gpu: GpuInventory) -> GpuSample:
        faults = self._faults[gpu.index]
        if faults.lost:
            return GpuSample(index=gpu.index, uuid=gpu.uuid, utilization_pct=0.0, memory_used_mib=0,
                             memory_total_mib=gpu.memory_mib, power_w=0.0, temperature_c=0.0, sm_clock_mhz=0,
                             healthy=False)
        jitter = (zlib.crc32(f"{self._node_id}/{gpu.index}/{self._tick}".encode()) % 1000) / 1000.0
        loads = [(job, load) for job, load in sorted(self._loads.items()) if gpu.index in load.gpu_indices]
        util = min(100.0, sum(load.share_milli / 1000 * (80.0 + 20.0 * jitter) for _, load in loads))
        processes = []
        for _, load in loads:
            share = load.share_milli / 1000
            used = load.memory_mib if load.memory_mib is not None else int(gpu.memory_mib * share * (0.6 + 0.3 * jitter))
            processes.append(GpuProcessSample(pid=load.pid, memory_used_mib=min(used, gpu.memory_mib)))
        memory_used = min(gpu.memory_mib, sum(p.memory_used_mib for p in processes))
        busy = util / 100.0
        temperature, clock, power = 32.0 + 40.0 * busy, 345 + int(1635 * min(1.0, busy * 2)), 70.0 + 580.0 * busy
        if faults.throttle & {"thermal"}:
            temperature, clock = max(temperature, 92.0), min(clock, 900)
        if faults.throttle & {"power"}:
            power, clock = 700.0, min(clock, 1200)
        return GpuSample(index=gpu.index, uuid=gpu.uuid, utilization_pct=round(util, 1),
                         memory_used_mib=memory_used, memory_total_mib=gpu.memory_mib, power_w=round(power, 1),
                         temperature_c=round(temperature, 1), sm_clock_mhz=clock, processes=processes,
                         throttle_reasons=self._throttle_reasons(faults))

    @staticmethod
    def _throttle_reasons(faults: _GpuFaults) -> list[str]:
        reasons = []
        if "thermal" in faults.throttle:
            reasons += ["hw_slowdown", "hw_thermal_slowdown"]
        if "power" in faults.throttle:
            reasons.append("sw_power_cap")
        return reasons

    # --- health and faults --------------------------------------------------------------------------

    def health(self) -> list[HealthObservation]:
        out = []
        for gpu in self._gpus:
            faults = self._faults[gpu.index]
            xids, faults.xids = tuple(faults.xids), []
            out.append(HealthObservation(
                index=gpu.index, uuid=gpu.uuid, reachable=not faults.lost, xids=xids,
                ecc_uncorrected=faults.ecc_uncorrected, throttle_reasons=tuple(self._throttle_reasons(faults)),
                temperature_c=92.0 if "thermal" in faults.throttle else 40.0))
        return out

    def device_minors(self) -> dict[int, int]:
        return {}  # simulated GPUs have no device files

    def inject(self, fault: Fault) -> None:
        if fault.kind == "partition":
            return  # the agent's transport handles it
        if fault.gpu not in self._faults:
            raise ValueError(f"fault {fault.describe()}: this node has no GPU {fault.gpu}")
        state = self._faults[fault.gpu]
        match fault.kind:
            case "xid":
                state.xids.append(int(fault.value or 0))
                if fault.value == 79:
                    state.lost = True
            case "ecc":
                state.ecc_uncorrected += int(fault.value or 1)
            case "thermal" | "power":
                state.throttle.add(fault.kind)
            case "offbus":
                state.lost = True
                state.xids.append(79)
            case "clear":
                state.throttle.clear()

    def close(self) -> None:
        return None
