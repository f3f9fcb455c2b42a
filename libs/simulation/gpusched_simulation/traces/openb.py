"""Loading the Alibaba openb traces (node list and pod list CSVs) into engine values.

One reader of pod lists (``read_pod_rows``) serves both simulations: the placement replay takes the
pods alone (``load_pods``), the preemption replay also their life in the trace (``PodLife``: QoS,
creation and deletion times, which not every openb pod list has).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpusched_core.placement import (
    MILLI_PER_GPU,
    MODEL_LABEL,
    Gpu,
    GpuShare,
    Node,
    NodeId,
    PodRequest,
    RequestId,
    WholeGpus,
)

from .location import traces_dir

# GPU memory per openb model (MiB), as in the FGD artifact; G1-G3 are undisclosed (0 = unknown).
GPU_MEMORY_MIB = {
    "P4": 7611, "T4": 15109, "V100M16": 16160, "P100": 16280, "A10": 22731, "V100M32": 32510, "A100": 81251,
}  # fmt: skip


def default_nodes_path() -> Path:
    return traces_dir() / "alibaba-openb-v2023" / "openb_node_list_gpu_node.csv"


def default_pods_path() -> Path:
    return traces_dir() / "alibaba-openb-v2023" / "openb_pod_list_default.csv"


def published_dir() -> Path:
    return traces_dir() / "fgd-published-results"


def load_nodes(path: Path) -> list[Node]:
    """Nodes of an openb node list (``sn, cpu_milli, memory_mib, gpu, model``), in file order."""
    nodes = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            model = row.get("model") or ""
            count = int(row["gpu"] or 0)
            memory = GPU_MEMORY_MIB.get(model, 0)
            gpus = tuple(Gpu(index=i, model=model, memory_mib=memory) for i in range(count))
            labels = {MODEL_LABEL: model} if model else {}
            nodes.append(Node(NodeId(row["sn"]), int(row["cpu_milli"]), int(row["memory_mib"]), gpus, labels))
    return nodes


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of the trace as a request, with the GPU milli it asks of the cluster."""

    request: PodRequest
    gpu_milli: int


@dataclass(frozen=True, slots=True)
class PodLife:
    """A pod's life in the trace: its QoS class and when it was created and deleted (seconds)."""

    qos: str
    created_s: float
    deleted_s: float


def pod_request(name: str, cpu_milli: int, memory_mib: int, num_gpu: int, gpu_milli: int,
                gpu_spec: str) -> PodRequest:  # fmt: skip
    """An openb pod row as a request: ``num_gpu == 1`` with ``gpu_milli < 1000`` is a GPU share."""
    if num_gpu == 0:
        gpu = None
    elif num_gpu == 1 and 0 < gpu_milli < MILLI_PER_GPU:
        gpu = GpuShare(gpu_milli)
    else:
        gpu = WholeGpus(num_gpu)
    models = frozenset(m for m in gpu_spec.split("|") if m) if num_gpu else frozenset()
    return PodRequest(RequestId(name), gpu, cpu_milli, memory_mib, models)


def _life(row: dict[str, str]) -> PodLife | None:
    created, deleted = row.get("creation_time") or "", row.get("deletion_time") or ""
    if not created or not deleted:
        return None
    return PodLife(row.get("qos") or "BE", float(created), float(deleted))


def read_pod_rows(path: Path) -> Iterator[tuple[TracePod, PodLife | None]]:
    """Each pod of an openb pod list, in file order, with its life in the trace (None: the list has none)."""
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            num_gpu = int(row["num_gpu"] or 0)
            gpu_milli = int(row["gpu_milli"] or 0) if num_gpu else 0
            request = pod_request(row["name"], int(row["cpu_milli"]), int(row["memory_mib"]), num_gpu,
                                  gpu_milli, row.get("gpu_spec") or "")  # fmt: skip
            yield TracePod(request, request.gpu_milli_total), _life(row)


def load_pods(path: Path) -> list[TracePod]:
    """Pods of an openb pod list, sorted by name (the artifact's order before shuffling)."""
    pods = [pod for pod, _ in read_pod_rows(path)]
    pods.sort(key=lambda pod: pod.request.id)
    return pods
