"""Which kinds of node the workload's constrained requests will need (for ``ours``).

FGD measures a node's fragmentation against the whole workload, node by node: a GPU given to a
request that could run anywhere looks as good as any other, even when requests that can run *only*
on nodes of that kind will need every one of them. Two things confine a request:

- a pinned GPU model (the FGD paper's ``gpuspec`` traces): T4-only pods need the T4 GPUs;
- its size: a pod asking 8 GPUs and 120 CPUs fits only nodes with 8 GPUs and at least 120 CPUs (on
  openb, the 39 G3 nodes, 5% of the GPUs); the paper's ``multigpu`` traces ask for enough such pods
  to fill those nodes, and an unconstrained pod put there by FGD leaves them no room.

Nodes are grouped in *classes* (``NodeClasses``): equal GPU models and CPU capacity, so an empty node
of a class fits the same requests (memory is left out, as in the fragmentation measure). A shape is
*constrained* when it pins models or fits in less than half the cluster's GPUs (a shape that fits
nearly everywhere, as most do, would press on every class alike and only spread load). The
pressure on class ``k`` is the share of its capacity that constrained demand needs, each
constrained shape's demand spread over the classes it fits in proportion to their capacity::

    pressure(k) = sum over constrained shapes t fitting k of  d_t / c(fit_t)

with ``d_t`` the shape's share of the workload's GPU demand and ``c(S)`` the share of the cluster's
GPUs in classes ``S``. 0 for every class when nothing is constrained (then ``ours`` is unchanged);
about 1 where constrained demand alone would fill the class at full load.

A request that fits several classes pays, in milli of fragmentation growth, for the pressure of the
GPUs it would take above the least pressed class it fits: ``weight * (pressure - least) * GPU milli
asked`` (see ``scarcity_cost``). A request that fits one class pays nothing (its candidates are equal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .fragmentation import WorkloadDistribution
from .layout import ClusterLayout
from .model import MILLI_PER_GPU, GpuShare, PodRequest, WholeGpus
from .snapshot import ClusterSnapshot

_MAX_PRESSURE = 2.0
_MINORITY = 0.5  # a shape that fits in less than this share of the cluster's GPUs is constrained


@dataclass(frozen=True, eq=False)
class NodeClasses:
    """A layout's nodes by class (equal GPU models, in order, and CPU capacity): each node's and each
    GPU's class (``K`` = no GPU), and per class its GPUs in all, its nodes' GPU models and CPU."""

    layout: ClusterLayout
    node_class: np.ndarray  # (nodes,)
    class_of: np.ndarray  # (nodes, gpus) the node's class where a GPU is present, else K
    count: np.ndarray  # (K,) GPUs of the class's nodes, together
    models: tuple[tuple[str, ...], ...]  # (K,) the models of one node's GPUs
    cpu_milli: tuple[int, ...]  # (K,) one node's CPU
    _fits: dict[tuple[int, int, frozenset[str]], tuple[bool, ...]] = field(default_factory=dict, repr=False)

    @cached_property
    def counts(self) -> tuple[float, ...]:
        """``count`` as Python floats."""
        return tuple(self.count.tolist())

    @classmethod
    def of(cls, layout: ClusterLayout) -> NodeClasses:
        keys: dict[tuple[tuple[str, ...], int], int] = {}
        node_class = np.array([keys.setdefault((tuple(g.model for g in node.gpus), node.cpu_milli), len(keys))
                               for node in layout.nodes], dtype=np.int64)  # fmt: skip
        size = len(keys)
        class_of = np.where(layout.gpu_present, node_class[:, None], size).astype(np.int64)
        count = np.bincount(class_of.ravel(), minlength=size + 1)[:size].astype(float)
        return cls(layout, node_class, class_of, count, tuple(m for m, _ in keys), tuple(c for _, c in keys))

    def fits(self, cpu_milli: int, gpu_count: int, allowed_models: frozenset[str]) -> tuple[bool, ...]:
        """(K,) whether an empty node of each class has the CPU and ``gpu_count`` GPUs of an allowed
        model (any model when none is named)."""
        key = (cpu_milli, gpu_count, allowed_models)
        if key not in self._fits:
            self._fits[key] = tuple(
                cpu >= cpu_milli and gpu_count <= sum(1 for m in models if not allowed_models or m in allowed_models)
                for models, cpu in zip(self.models, self.cpu_milli, strict=True))  # fmt: skip
        return self._fits[key]


def class_pressure(workload: WorkloadDistribution, classes: NodeClasses) -> np.ndarray:
    """(K,) pressure of constrained demand on each node class (see the module doc)."""
    capacity = classes.count
    pressure = np.zeros(capacity.size)
    demand = [(s, w * s.gpu_milli * s.gpu_count) for s, w in zip(workload.shapes, workload.weights, strict=True)]
    total_demand = sum(d for _, d in demand)
    total_capacity = capacity.sum()
    if total_demand <= 0 or total_capacity <= 0:
        return pressure
    for shape, d in demand:
        if d <= 0:
            continue
        fit = np.array(classes.fits(shape.cpu_milli, shape.gpu_count, shape.allowed_models), bool)
        share = capacity[fit].sum() / total_capacity
        if share > 0 and (shape.allowed_models or share < _MINORITY):
            pressure[fit] += (d / total_demand) / share
    return np.minimum(pressure, _MAX_PRESSURE)


def scarcity_cost(pressure: np.ndarray, classes: NodeClasses, snapshot: ClusterSnapshot, request: PodRequest,
                  nodes: np.ndarray, slack: float = 0.8) -> np.ndarray:  # fmt: skip
    """(len(nodes), gpus) milli a request pays for taking GPUs that constrained demand still needs.

    ``pressure`` is ``class_pressure``. A class's constrained demand still to come is its pressure
    times its capacity times the share of the cluster's GPU still free; its tightness is that over
    its free GPU milli. A GPU costs the request's GPU milli times how far its class's tightness
    exceeds both ``slack`` and the tightness of the least tight class the request fits (so a class
    with GPUs to spare costs nothing); every GPU of a node costs alike. The plain computation ``ours``
    is tested against.
    """
    size = pressure.size
    free = np.bincount(classes.class_of.ravel(), weights=snapshot.share_free.ravel(), minlength=size + 1)[:size]
    per_class = class_excess(pressure.tolist(), classes, free.tolist(), request, slack)
    if per_class is None:
        return np.zeros((nodes.size, classes.class_of.shape[1]))
    per_node = np.minimum(np.array(per_class)[classes.node_class[nodes]], _MAX_PRESSURE) * request.gpu_milli_total
    return np.repeat(per_node[:, None], classes.class_of.shape[1], axis=1)


def class_excess(pressure: list[float], classes: NodeClasses, free: list[float], request: PodRequest,
                 slack: float = 0.8) -> list[float] | None:  # fmt: skip
    """(K + 1) how far each class's tightness exceeds what the request pays nothing for (see
    ``scarcity_cost``; the last entry, no GPU, is 0), from each class's pressure and free GPU milli (K);
    None when the cluster has no GPU or the request fits no class.

    A handful of classes: plain float arithmetic (the same IEEE operations, in the same order, as
    numpy's elementwise ones) costs less than a dozen numpy calls on every decision."""
    counts = classes.counts
    capacity = float(sum(counts)) * MILLI_PER_GPU
    if capacity <= 0:
        return None
    still_free = float(sum(free)) / capacity
    tight = [p * c * MILLI_PER_GPU * still_free / max(f, 1.0) for p, c, f in zip(pressure, counts, free)]
    if max(tight, default=0.0) <= slack:  # no class is tight beyond the slack: nothing to pay anywhere
        return [0.0] * (len(tight) + 1)
    usable = classes.fits(request.cpu_milli, gpus_asked(request), request.allowed_models)
    if not any(usable):
        return None
    least = max(min(t for t, u in zip(tight, usable, strict=True) if u), slack)
    return [max(t - least, 0.0) if u else 0.0 for t, u in zip(tight, usable, strict=True)] + [0.0]


def gpus_asked(request: PodRequest) -> int:
    """GPUs one node must offer the request: its count for whole GPUs, 1 for a share, else 0."""
    if isinstance(request.gpu, WholeGpus):
        return request.gpu.count
    return 1 if isinstance(request.gpu, GpuShare) else 0
