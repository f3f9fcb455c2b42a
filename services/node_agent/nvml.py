"""NVML backends behind one interface: real GPUs through pynvml, or a simulated node (see simulated.py).

The agent only talks to `NvmlBackend`; `make_backend` picks one from settings.
"""

from __future__ import annotations

from typing import Protocol

from gpusched_common.events import GpuSample

from services.node_agent.faults import Fault
from services.node_agent.inventory import HealthObservation, NodeInfo
from services.node_agent.simulated import GpuGroup, SimulatedNvml, parse_gpu_spec

__all__ = ["GpuGroup", "NodeInfo", "NvmlBackend", "SimulatedNvml", "make_backend", "parse_gpu_spec"]


class NvmlBackend(Protocol):
    name: str

    def node_info(self) -> NodeInfo: ...

    def sample(self) -> list[GpuSample]: ...

    def health(self) -> list[HealthObservation]: ...

    def attach(self, job_id: str, gpu_indices: tuple[int, ...], pid: int, share_milli: int | None = None,
               memory_mib: int | None = None) -> None:
        """A job started on these GPUs (the simulated backend's load follows it)."""

    def detach(self, job_id: str) -> None: ...

    def mig_device_for(self, job_id: str, gpu_index: int, profile: str, start: int) -> str:
        """The UUID of the MIG device the job gets for its placement; raises ValueError with the reason."""
        ...

    def device_minors(self) -> dict[int, int]:
        """Each GPU's NVIDIA device file minor (``/dev/nvidia<minor>``) by index; {} where there are none."""
        ...

    def inject(self, fault: Fault) -> None: ...

    def close(self) -> None: ...


def make_backend(kind: str, node_id: str, simulated_gpus: str) -> NvmlBackend:
    if kind == "real":
        from services.node_agent.real_nvml import RealNvml

        return RealNvml()
    return SimulatedNvml(node_id, simulated_gpus)
