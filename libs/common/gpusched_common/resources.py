"""GPU models we know and the limits of a request (DESIGN.md section 5)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int
    aliases: tuple[str, ...] = ()


GPU_MODELS: tuple[GpuModel, ...] = (
    GpuModel("H100-80GB", 81559, ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3", "H100")),
    GpuModel("H200-141GB", 143771, ("NVIDIA-H200", "NVIDIA H200", "H200")),
    GpuModel("A100-80GB", 81920, ("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB")),
    GpuModel("A100-40GB", 40960, ("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB")),
    GpuModel("L40S-48GB", 46068, ("NVIDIA-L40S", "NVIDIA L40S", "L40S")),
    GpuModel("L4-24GB", 23034, ("NVIDIA-L4", "NVIDIA L4", "L4")),
    GpuModel("T4-16GB", 15360, ("Tesla-T4", "Tesla T4", "T4")),
    GpuModel("V100-32GB", 32768, ("Tesla-V100-SXM2-32GB", "Tesla V100-SXM2-32GB", "V100")),
)

_BY_NAME: dict[str, str] = {}
for _model in GPU_MODELS:
    for _name in (_model.name, *_model.aliases):
        _BY_NAME[_name.lower()] = _model.name

MAX_GPUS_PER_JOB = 8  # whole GPUs per node (per gang member)
MAX_GANG_NODES = 64
MAX_CPU_MILLI_PER_NODE = 1_024_000  # host CPU a job may ask for on one node (1,024 cores)
MAX_MEMORY_MIB_PER_NODE = 16 * 1024 * 1024  # host memory a job may ask for on one node (16 TiB)

MAX_PRIORITY = 1000
MAX_COMMAND_BYTES = 64 * 1024
MAX_SUBMISSION_BYTES = 1024 * 1024


def canonical_model(name: str) -> str | None:
    """The canonical name of a GPU model, accepting NVML and Kubernetes label spellings."""
    return _BY_NAME.get(name.strip().lower())


def model_memory_mib(name: str) -> int:
    canonical = canonical_model(name)
    for model in GPU_MODELS:
        if model.name == canonical:
            return model.memory_mib
    raise KeyError(name)
