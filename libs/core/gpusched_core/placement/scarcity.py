"""How much of each GPU model the workload's model-constrained requests will need (for ``ours``).

FGD measures a node's fragmentation against the whole workload, node by node: a T4 GPU given to a
request that could run anywhere looks as good as a G2 GPU, even when the requests that can run
*only* on T4 will need every T4 GPU there is. When many pods pin a GPU model (the FGD paper's
``gpuspec`` traces) the pinned pods then fail while GPUs of other models stay free.

The pressure on model ``m`` is the share of its capacity that constrained demand needs, each
constrained shape's demand spread over the models it allows in proportion to their capacity::

    pressure(m) = sum over constrained shapes t allowing m of  d_t / c(allowed_t)

with ``d_t`` the shape's share of the workload's GPU demand and ``c(S)`` the share of the cluster's
GPUs of models in ``S``. 0 for every model when nothing is constrained (then ``ours`` is unchanged);
about 1 where constrained demand alone would fill the model at full load.

A request that may use several models pays, in milli of fragmentation growth, for the pressure of
the GPUs it would take above the least pressed model it could use: ``weight * (pressure - least) *
GPU milli asked``. A request pinned to one model pays nothing (all its candidates are equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fragmentation import WorkloadDistribution
from .layout import ClusterLayout
from .model import MILLI_PER_GPU, PodRequest
from .snapshot import ClusterSnapshot

_MAX_PRESSURE = 2.0


def model_pressure(workload: WorkloadDistribution, layout: ClusterLayout) -> np.ndarray:
    """(len(layout.models),) pressure of constrained demand on each model (see the module doc)."""
    models = layout.models
    capacity = np.array([(layout.gpu_present & (layout.gpu_model == i)).sum() for i in range(len(models))], float)
    pressure = np.zeros(len(models))
    demand = [(s, w * s.gpu_milli * s.gpu_count) for s, w in zip(workload.shapes, workload.weights, strict=True)]
    total_demand = sum(d for _, d in demand)
    total_capacity = capacity.sum()
    if total_demand <= 0 or total_capacity <= 0:
        return pressure
    for shape, d in demand:
        if not shape.allowed_models or d <= 0:
            continue
        allowed = np.array([model in shape.allowed_models for model in models], bool)
        share = capacity[allowed].sum() / total_capacity
        if share > 0:
            pressure[allowed] += (d / total_demand) / share
    return np.minimum(pressure, _MAX_PRESSURE)


@dataclass(frozen=True, eq=False)
class ModelIndex:
    """A layout's GPUs by model, for per-decision sums: each GPU's model (``K`` = none), GPUs per model."""

    layout: ClusterLayout
    model_of: np.ndarray  # (nodes, gpus) model id, K where no GPU
    count: np.ndarray  # (K,)

    @classmethod
    def of(cls, layout: ClusterLayout) -> ModelIndex:
        size = len(layout.models)
        model_of = np.where(layout.gpu_present, layout.gpu_model, size).astype(np.int64)
        return cls(layout, model_of, np.bincount(model_of.ravel(), minlength=size + 1)[:size].astype(float))


def scarcity_cost(pressure: np.ndarray, index: ModelIndex, snapshot: ClusterSnapshot, request: PodRequest,
                  nodes: np.ndarray, per_gpu: bool, slack: float = 0.8) -> np.ndarray:  # fmt: skip
    """(len(nodes), gpus) milli a request pays for taking GPUs that pinned demand still needs.

    ``pressure`` is ``model_pressure`` (per model). A model's pinned demand still to come is its
    pressure times its capacity times the share of the cluster's GPU still free; its tightness is
    that over its free GPU milli. A GPU costs the request's GPU milli times how far its model's
    tightness exceeds both ``slack`` and the tightness of the least tight model the request may use
    (so a model with GPUs to spare costs nothing). ``per_gpu``: a shared request takes one GPU
    (column g: that GPU); otherwise the node's tightest allowed GPU counts for all of them.
    """
    size = pressure.size
    free = np.bincount(index.model_of.ravel(), weights=snapshot.share_free.ravel(), minlength=size + 1)[:size]
    per_model = model_excess(pressure, index, free, request, slack)
    if per_model is None:
        return np.zeros((nodes.size, index.model_of.shape[1]))
    excess = per_model[index.model_of[nodes]]
    if not per_gpu:
        excess = np.repeat(excess.max(axis=1, keepdims=True), excess.shape[1], axis=1)
    return np.minimum(excess, _MAX_PRESSURE) * request.gpu_milli_total


def model_excess(pressure: np.ndarray, index: ModelIndex, free: np.ndarray, request: PodRequest,
                 slack: float = 0.8) -> np.ndarray | None:  # fmt: skip
    """(K + 1,) how far each model's tightness exceeds what the request pays nothing for (see
    ``scarcity_cost``; the last entry, no GPU, is 0), from the free GPU milli of each model (K,);
    None when the cluster has no GPU or the request may use none of its models.

    A handful of models: plain float arithmetic (the same IEEE operations, in the same order, as
    numpy's elementwise ones) costs less than a dozen numpy calls on every decision."""
    counts, frees = index.count.tolist(), free.tolist()
    capacity = float(sum(counts)) * MILLI_PER_GPU
    if capacity <= 0:
        return None
    still_free = float(sum(frees)) / capacity
    tight = [p * c * MILLI_PER_GPU * still_free / max(f, 1.0) for p, c, f in zip(pressure.tolist(), counts, frees)]
    models = index.layout.models
    usable = [c > 0 and (not request.allowed_models or m in request.allowed_models) for c, m in zip(counts, models)]
    if not any(usable):
        return None
    least = max(min(t for t, u in zip(tight, usable, strict=True) if u), slack)
    return np.array([max(t - least, 0.0) if u else 0.0 for t, u in zip(tight, usable, strict=True)] + [0.0])
