"""Fragmentation Gradient Descent (FGD, USENIX ATC'23) and the machinery it shares with our policies.

For every feasible node (and, for a shared request, every GPU that fits) FGD computes how much the
node's fragmentation against the workload would grow if the request were placed there, and picks
the smallest growth. The published scorer maps the change through ``int(100 * sigmoid(-growth /
1000))``; that truncation makes many nodes tie, and the engine gives ties to the first node in
snapshot order (the artifact's deterministic scheduler), which packs. Without the truncation
(``fgd-exact``) FGD spreads load and does far worse on the openb traces.

Speed: the growth of a node depends only on that node's free CPU and GPU milli and on the request's
shape, so results are memoised per shape and recomputed only for the nodes whose free capacity
changed since (a content comparison, never a version counter, so any lineage of snapshots is safe).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .feasibility import gpu_free_for
from .fragmentation import (
    ShapeArrays,
    WorkloadDistribution,
    shape_arrays,
    shape_stats,
    usable_from_stats,
    usable_milli,
)
from .model import MILLI_PER_GPU, GpuShare, MigSlice, PodRequest, WholeGpus
from .policies import MAX_NODE_SCORE, Candidates, NodeScores, mig_packing_scores
from .snapshot import ClusterLayout, ClusterSnapshot

_MAX_CACHED_SHAPES = 512


def _frag(free: np.ndarray, cpu: np.ndarray, shapes: ShapeArrays, rows: np.ndarray, measure: str) -> np.ndarray:
    return free.sum(axis=-1) - usable_milli(free, cpu, shapes, rows, measure)


def frag_growth(
    snapshot: ClusterSnapshot, request: PodRequest, shapes: ShapeArrays, rows: np.ndarray, measure: str = "fgd"
) -> np.ndarray:
    """(len(rows), gpus) growth of node fragmentation (milli) if ``request`` goes to each node.

    Column g is the growth with a shared request on GPU g (+inf where it does not fit); for other
    requests every column holds the same value (the GPUs they take do not change the result).
    Rounded to a millionth of a milli: the weighted sums over shapes differ in their last bits with the
    number of rows computed at once, and a node's growth must not depend on which other rows were
    recomputed with it (the memo recomputes only changed rows).
    """
    return np.round(_frag_growth(snapshot, request, shapes, rows, measure), 6)


def _frag_growth(
    snapshot: ClusterSnapshot, request: PodRequest, shapes: ShapeArrays, rows: np.ndarray, measure: str
) -> np.ndarray:
    free = snapshot.share_free[rows].astype(np.int64)
    if request.allowed_models:
        allowed = gpu_free_for(snapshot, request)[rows]
    else:
        allowed = free
    cpu = snapshot.cpu_free[rows]
    count, usable = shape_stats(free, shapes, rows)  # (R, T)
    before = free.sum(axis=1) - usable_from_stats(count, usable, cpu, shapes, measure)
    cpu_after = cpu - request.cpu_milli
    gpu = request.gpu
    width = free.shape[1]
    if isinstance(gpu, GpuShare):
        fits = allowed >= gpu.milli
        if gpu.memory_mib:
            fits &= snapshot.gpu_memory_free[rows] >= gpu.memory_mib
        # Placing on GPU g changes only GPU g: update the per-shape stats instead of recomputing.
        old = free[:, :, None]  # (R, G, 1)
        new = old - gpu.milli
        was, now = old >= shapes.milli, new >= shapes.milli  # (R, G, T)
        if shapes.gpu_ok is not None:
            ok = np.moveaxis(shapes.gpu_ok[:, rows, :], 0, -1)
            was, now = was & ok, now & ok
        count_after = count[:, None, :] - was + now
        usable_after = usable[:, None, :] - old * was + new * now
        total_after = free.sum(axis=1) - gpu.milli
        after = total_after[:, None] - usable_from_stats(count_after, usable_after, cpu_after[:, None], shapes, measure)
        return np.where(fits, after - before[:, None], np.inf)
    if isinstance(gpu, WholeGpus):
        full = allowed == MILLI_PER_GPU
        taken = full & (np.cumsum(full, axis=1) <= gpu.count)
        after = _frag(np.where(taken, 0, free), cpu_after, shapes, rows, measure)
    else:
        after = _frag(free, cpu_after, shapes, rows, measure)
    return np.repeat((after - before)[:, None], width, axis=1)


@dataclass(eq=False)
class _Memo:
    layout: ClusterLayout
    cpu: np.ndarray
    free: np.ndarray
    memory: np.ndarray | None
    growth: np.ndarray


@dataclass(eq=False)
class FragmentationMemo:
    """Per-shape memo of ``frag_growth`` over all nodes, refreshed only where nodes changed."""

    workload: WorkloadDistribution
    measure: str = "fgd"
    _shapes: dict[int, tuple[ClusterLayout, ShapeArrays]] = field(default_factory=dict)
    _entries: OrderedDict[tuple[object, ...], _Memo] = field(default_factory=OrderedDict)

    def shapes_for(self, layout: ClusterLayout) -> ShapeArrays:
        cached = self._shapes.get(id(layout))
        if cached is None or cached[0] is not layout:
            self._shapes = {id(layout): (layout, shape_arrays(self.workload, layout))}
            cached = self._shapes[id(layout)]
        return cached[1]

    def growth(self, snapshot: ClusterSnapshot, request: PodRequest) -> np.ndarray:
        """(nodes, gpus) growth for every node (values of infeasible nodes are meaningless)."""
        layout = snapshot.layout
        shapes = self.shapes_for(layout)
        key = (id(layout), request.gpu, request.cpu_milli, request.allowed_models)
        needs_memory = isinstance(request.gpu, GpuShare) and request.gpu.memory_mib > 0
        entry = self._entries.get(key)
        if entry is None or entry.layout is not layout:
            rows = np.arange(layout.node_count)
            entry = _Memo(layout, snapshot.cpu_free, snapshot.share_free,
                          snapshot.gpu_memory_free if needs_memory else None,
                          frag_growth(snapshot, request, shapes, rows, self.measure))  # fmt: skip
            self._entries[key] = entry
            if len(self._entries) > _MAX_CACHED_SHAPES:
                self._entries.popitem(last=False)
            return entry.growth
        self._entries.move_to_end(key)
        changed = (entry.cpu != snapshot.cpu_free) | (entry.free != snapshot.share_free).any(axis=1)
        if needs_memory:
            changed |= (entry.memory != snapshot.gpu_memory_free).any(axis=1)
        rows = np.flatnonzero(changed)
        if rows.size:
            growth = entry.growth.copy()
            growth[rows] = frag_growth(snapshot, request, shapes, rows, self.measure)
            entry.growth, entry.cpu, entry.free = growth, snapshot.cpu_free, snapshot.share_free
            if needs_memory:
                entry.memory = snapshot.gpu_memory_free
        return entry.growth


def sigmoid_score(growth: np.ndarray) -> np.ndarray:
    """The published FGD score: int64(sigmoid(-growth / 1000) * 100)."""
    with np.errstate(over="ignore"):
        return np.trunc(MAX_NODE_SCORE / (1.0 + np.exp(growth / 1000.0)))


@dataclass(eq=False)
class FgdPolicy:
    """FGD as published: least fragmentation growth, scored through a truncated sigmoid, against
    the most popular shapes covering ``popularity`` of the workload (the artifact's typical pods)."""

    workload: WorkloadDistribution
    name: str = "fgd"
    quantized: bool = True
    popularity: float = 0.95
    memo: FragmentationMemo = field(init=False)

    def __post_init__(self) -> None:
        self.memo = FragmentationMemo(self.workload.most_popular(self.popularity))

    def score(self, candidates: Candidates) -> NodeScores:
        if isinstance(candidates.request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        growth = self.memo.growth(candidates.snapshot, candidates.request)[candidates.nodes]
        per_gpu = sigmoid_score(growth) if self.quantized else -growth
        per_gpu = np.where(np.isinf(growth), -np.inf, per_gpu)
        best_gpu = per_gpu.argmax(axis=1)  # first GPU among equals, as the artifact does
        values = per_gpu[np.arange(best_gpu.size), best_gpu]
        share = best_gpu if isinstance(candidates.request.gpu, GpuShare) else None
        meaning = "FGD score" if self.quantized else "-(fragmentation growth, milli)"
        return NodeScores(values, share, meaning=meaning)
