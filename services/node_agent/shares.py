"""The environment a job gets from its placement (pure): visible devices and fractional GPU shares.

A share of a GPU is enforced through CUDA MPS where the node runs an MPS control daemon:
`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` caps the SMs a client may use and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
its device memory. Without MPS the variables are still set (CUDA ignores them) and the parts that could
not be enforced are listed, so they are reported with the job's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JobEnvironment:
    env: dict[str, str]
    unenforced: tuple[str, ...] = ()


def visible_devices(gpu_indices: tuple[int, ...], gpu_uuids: tuple[str, ...]) -> str:
    """MIG devices are addressed by UUID (`MIG-...`); whole GPUs by index."""
    if gpu_uuids and all(u.startswith("MIG-") for u in gpu_uuids):
        return ",".join(gpu_uuids)
    return ",".join(str(i) for i in gpu_indices)


def job_environment(*, gpu_indices: tuple[int, ...], gpu_uuids: tuple[str, ...], share_milli: int | None,
                    memory_mib: int | None, mps_pipe_dir: Path | None) -> JobEnvironment:
    env = {"CUDA_VISIBLE_DEVICES": visible_devices(gpu_indices, gpu_uuids), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    unenforced: list[str] = []
    fractional = share_milli is not None and 0 < share_milli < 1000
    if not fractional and memory_mib is None:
        return JobEnvironment(env)
    if mps_pipe_dir is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(mps_pipe_dir)
    if fractional:
        assert share_milli is not None
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(share_milli / 10)))
        env["GPUSCHED_GPU_SHARE_MILLI"] = str(share_milli)
        if mps_pipe_dir is None:
            unenforced.append(f"compute share {share_milli}/1000 not enforced: no CUDA MPS daemon on this node")
    if memory_mib is not None:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={memory_mib}M" for i in range(len(gpu_indices) or 1))
        env["GPUSCHED_GPU_MEMORY_LIMIT_MIB"] = str(memory_mib)
        if mps_pipe_dir is None:
            unenforced.append(f"GPU memory limit {memory_mib} MiB not enforced: no CUDA MPS daemon on this node")
    return JobEnvironment(env, tuple(unenforced))
