"""The static part of a cluster: nodes, GPU models and memory, NVLink domains, MIG families, labels.

Arrays are indexed (node, GPU); a node's GPUs are its ``Node.gpus`` in order. The layout never
changes with allocations, so masks derived from it are memoised on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .mig import MIG_FAMILIES, mig_family
from .model import MILLI_PER_GPU, Node, NodeId, PlacementError

MIG_FAMILY_NAMES: tuple[str, ...] = tuple(MIG_FAMILIES)


def readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class ClusterLayout:
    """What does not change with allocations: nodes, GPU models, memory, NVLink domains, labels.

    GPU-indexed arrays have shape (nodes, max_gpus); absent GPUs are masked by ``gpu_present``.
    ``_memo`` caches masks derived from this immutable layout (pure memoisation).
    """

    nodes: tuple[Node, ...]
    index_of: Mapping[NodeId, int]
    models: tuple[str, ...]
    gpu_count: np.ndarray
    gpu_present: np.ndarray
    gpu_model: np.ndarray
    gpu_memory_mib: np.ndarray
    nvlink_domain: np.ndarray
    mig_family: np.ndarray
    cpu_capacity: np.ndarray
    memory_capacity: np.ndarray
    _memo: dict[object, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    @property
    def max_gpus(self) -> int:
        return int(self.gpu_present.shape[1])

    @property
    def max_cpu_milli(self) -> int:
        """CPU of the largest node: the normaliser of score formulas (at least 1)."""
        return max(int(self.cpu_capacity.max()) if self.node_count else 0, 1)

    @property
    def max_gpu_milli(self) -> int:
        """GPU milli of the node with most GPUs (at least one GPU's worth, so it can divide)."""
        most = int(self.gpu_count.max()) if self.node_count else 0
        return max(most, 1) * MILLI_PER_GPU

    def model_mask(self, allowed_models: frozenset[str]) -> np.ndarray:
        """(nodes, gpus) mask of present GPUs whose model is allowed (any model when empty)."""
        key = ("models", allowed_models)
        if key not in self._memo:
            if allowed_models:
                ids = [i for i, model in enumerate(self.models) if model in allowed_models]
                mask = np.isin(self.gpu_model, ids) & self.gpu_present
            else:
                mask = self.gpu_present.copy()
            self._memo[key] = readonly(mask)
        return self._memo[key]

    def selector_mask(self, selector: tuple[tuple[str, str], ...]) -> np.ndarray:
        """(nodes,) mask of nodes whose labels contain every selector pair."""
        key = ("selector", selector)
        if key not in self._memo:
            mask = np.fromiter(
                (all(node.labels.get(k) == v for k, v in selector) for node in self.nodes),
                dtype=bool,
                count=self.node_count,
            )
            self._memo[key] = readonly(mask)
        return self._memo[key]

    def label_values(self, key: str) -> np.ndarray:
        """(nodes,) integer code of each node's value for label ``key`` (-1 when absent)."""
        memo_key = ("label", key)
        if memo_key not in self._memo:
            codes: dict[str, int] = {}
            values = [node.labels.get(key) for node in self.nodes]
            array = np.array(
                [-1 if v is None else codes.setdefault(v, len(codes)) for v in values], dtype=np.int64
            )
            self._memo[memo_key] = readonly(array)
        return self._memo[memo_key]


def build_layout(nodes: Iterable[Node]) -> ClusterLayout:
    """Lay out ``nodes`` in the order given (ids must be unique)."""
    node_tuple = tuple(nodes)
    index_of: dict[NodeId, int] = {}
    for position, node in enumerate(node_tuple):
        if node.id in index_of:
            raise PlacementError(f"duplicate node id {node.id}")
        index_of[node.id] = position
    count = len(node_tuple)
    max_gpus = max((len(node.gpus) for node in node_tuple), default=0) or 1
    models = tuple(sorted({gpu.model for node in node_tuple for gpu in node.gpus}))
    model_id = {model: i for i, model in enumerate(models)}
    present = np.zeros((count, max_gpus), dtype=bool)
    gpu_model = np.full((count, max_gpus), -1, dtype=np.int32)
    memory = np.zeros((count, max_gpus), dtype=np.int64)
    nvlink = np.full((count, max_gpus), -1, dtype=np.int32)
    family = np.full((count, max_gpus), -1, dtype=np.int8)
    for row, node in enumerate(node_tuple):
        for gpu in node.gpus:
            present[row, gpu.index] = True
            gpu_model[row, gpu.index] = model_id[gpu.model]
            memory[row, gpu.index] = gpu.memory_mib
            nvlink[row, gpu.index] = -1 if gpu.nvlink_domain is None else gpu.nvlink_domain
            fam = mig_family(gpu.model)
            family[row, gpu.index] = -1 if fam is None else MIG_FAMILY_NAMES.index(fam)
    return ClusterLayout(
        nodes=node_tuple,
        index_of=MappingProxyType(index_of),
        models=models,
        gpu_count=readonly(present.sum(axis=1).astype(np.int64)),
        gpu_present=readonly(present),
        gpu_model=readonly(gpu_model),
        gpu_memory_mib=readonly(memory),
        nvlink_domain=readonly(nvlink),
        mig_family=readonly(family),
        cpu_capacity=readonly(np.array([n.cpu_milli for n in node_tuple], dtype=np.int64)),
        memory_capacity=readonly(np.array([n.memory_mib for n in node_tuple], dtype=np.int64)),
    )
