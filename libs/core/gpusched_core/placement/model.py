"""Value types of the placement core: nodes, GPUs, requests, bindings and decisions.

Everything here is a frozen dataclass: a decision can be logged, replayed and compared.
Units are in the names (``cpu_milli``, ``memory_mib``, ``gpu_milli``); one whole GPU is
``MILLI_PER_GPU`` milli.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NewType, TypeAlias

NodeId = NewType("NodeId", str)
RequestId = NewType("RequestId", str)

MILLI_PER_GPU = 1000
DEFAULT_TOPOLOGY_KEY = "gpusched.io/topology-block"
MODEL_LABEL = "nvidia.com/gpu.product"


def _frozen_mapping(value: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(value or {}))


# the label a node agent sets when it runs containers (a runtime with GPU devices): a job with an image
# goes only to such nodes
CONTAINERS_LABEL = "gpusched.io/containers"


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU of a node. ``nvlink_domain``: GPUs of a node with the same id share NVLink/NVSwitch."""

    index: int
    model: str
    memory_mib: int = 0
    uuid: str = ""
    healthy: bool = True
    nvlink_domain: int | None = None
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """A schedulable machine. ``labels`` hold the node selector keys and the topology block label."""

    id: NodeId
    cpu_milli: int
    memory_mib: int
    gpus: tuple[Gpu, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _frozen_mapping(self.labels))
        object.__setattr__(self, "gpus", tuple(self.gpus))
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise ValueError(f"node {self.id}: GPU at position {position} has index {gpu.index}")


# --- what a request asks of GPUs -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WholeGpus:
    """``count`` fully free GPUs on one node (1..8 in practice)."""

    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("WholeGpus.count must be >= 1")


@dataclass(frozen=True, slots=True)
class GpuShare:
    """A fraction of one GPU: ``milli`` of its compute (1..999) and ``memory_mib`` of its memory."""

    milli: int
    memory_mib: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.milli < MILLI_PER_GPU:
            raise ValueError("GpuShare.milli must be in 1..999 (use WholeGpus(1) for a whole GPU)")
        if self.memory_mib < 0:
            raise ValueError("GpuShare.memory_mib must be >= 0")


@dataclass(frozen=True, slots=True)
class MigSlice:
    """One MIG instance of ``profile`` (e.g. ``3g.40gb``) on a MIG-enabled GPU."""

    profile: str


GpuAsk: TypeAlias = WholeGpus | GpuShare | MigSlice | None


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One placement unit: resources on a single node.

    ``allowed_models`` empty means any GPU model; ``node_selector`` pairs must all match node labels.
    """

    id: RequestId
    gpu: GpuAsk = None
    cpu_milli: int = 0
    memory_mib: int = 0
    allowed_models: frozenset[str] = frozenset()
    node_selector: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed_models", frozenset(self.allowed_models))
        object.__setattr__(self, "node_selector", tuple(sorted(dict(self.node_selector).items())))
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError("cpu_milli and memory_mib must be >= 0")

    @property
    def gpu_milli_total(self) -> int:
        """GPU milli this request takes from the cluster (MIG slices count by memory share)."""
        if isinstance(self.gpu, WholeGpus):
            return self.gpu.count * MILLI_PER_GPU
        if isinstance(self.gpu, GpuShare):
            return self.gpu.milli
        return 0


@dataclass(frozen=True, slots=True)
class GangRequest:
    """``node_count`` members of ``gpus_per_node`` whole GPUs each, on distinct nodes, all or nothing."""

    id: RequestId
    node_count: int
    gpus_per_node: int
    cpu_milli_per_node: int = 0
    memory_mib_per_node: int = 0
    allowed_models: frozenset[str] = frozenset()
    node_selector: tuple[tuple[str, str], ...] = ()
    topology_key: str = DEFAULT_TOPOLOGY_KEY

    def __post_init__(self) -> None:
        if self.node_count < 1 or self.gpus_per_node < 1:
            raise ValueError("a gang needs node_count >= 1 and gpus_per_node >= 1")

    def member(self, ordinal: int) -> PodRequest:
        """The request of member ``ordinal`` (0-based); its id is ``<gang id>/<ordinal>``."""
        return PodRequest(
            id=RequestId(f"{self.id}/{ordinal}"),
            gpu=WholeGpus(self.gpus_per_node),
            cpu_milli=self.cpu_milli_per_node,
            memory_mib=self.memory_mib_per_node,
            allowed_models=self.allowed_models,
            node_selector=self.node_selector,
        )


# --- what a decision grants ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """A MIG instance: ``profile`` starting at memory slice ``start`` of the GPU."""

    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class Binding:
    """Resources granted on one node. ``gpu_milli`` and ``gpu_memory_mib`` are per listed GPU;
    a whole GPU (``gpu_milli == 1000``) takes all of its memory and leaves ``gpu_memory_mib`` at 0."""

    node_id: NodeId
    gpu_indices: tuple[int, ...] = ()
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig: MigPlacement | None = None
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class NodeClassReason:
    """``node_count`` nodes failed for ``reason`` (the first check each of them failed)."""

    reason: str
    node_count: int

    def __str__(self) -> str:
        noun = "node" if self.node_count == 1 else "nodes"
        return f"{self.node_count} {noun}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of one placement: bindings and the reasons that chose them, or why nothing fits."""

    request_id: RequestId
    policy: str
    placed: bool
    bindings: tuple[Binding, ...] = ()
    reasons: tuple[str, ...] = ()
    unplaced_by_class: tuple[NodeClassReason, ...] = ()
    score: float | None = None

    @property
    def node_ids(self) -> tuple[NodeId, ...]:
        return tuple(binding.node_id for binding in self.bindings)


class PlacementError(ValueError):
    """An allocation that would break an invariant (over capacity, unknown node, duplicate id)."""
