"""Fragmentation Gradient Descent (FGD, USENIX ATC'23) and the machinery it shares with our policies.

For every feasible node (and, for a shared request, every GPU that fits) FGD computes how much the
node's fragmentation against the workload would grow if the request were placed there, and picks
the smallest growth. The published scorer maps the change through ``int(100 * sigmoid(-growth /
1000))``; that truncation makes many nodes tie, and the engine gives ties to the first node in
snapshot order (the artifact's deterministic scheduler), which packs. Without the truncation
(``fgd-exact``) FGD spreads load and does far worse on the openb traces.

Speed: the growth of a node depends only on that node's free CPU and GPU milli and on the request's
shape, so results are memoised per shape and recomputed only for the nodes that changed since and are
asked for (``frag_memo``), from per-node statistics (``growth``). ``frag_growth`` here is the plain
reference computation the memo is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kernel
from .feasibility import gpu_free_for
from .frag_memo import FragmentationMemo
from .fragmentation import ShapeArrays, WorkloadDistribution, shape_stats, usable_from_stats, usable_milli
from .model import MILLI_PER_GPU, GpuShare, MigSlice, PodRequest, WholeGpus
from .policies import MAX_NODE_SCORE, Candidates, NodeScores, mig_packing_scores
from .snapshot import ClusterSnapshot

__all__ = ["FgdPolicy", "FragmentationMemo", "best_fgd_score", "best_per_node", "fgd_scores", "frag_growth",
           "sigmoid_score"]

_NO_SECONDARY = kernel.Derive(False)  # FGD's best score is the truncated sigmoid alone


def _frag(free: np.ndarray, cpu: np.ndarray, shapes: ShapeArrays, rows: np.ndarray, measure: str) -> np.ndarray:
    return free.sum(axis=-1) - usable_milli(free, cpu, shapes, rows, measure)


def frag_growth(
    snapshot: ClusterSnapshot, request: PodRequest, shapes: ShapeArrays, rows: np.ndarray, measure: str = "fgd"
) -> np.ndarray:
    """(len(rows), gpus) growth of node fragmentation (milli) if ``request`` goes to each node.

    The reference computation: everything recomputed from the snapshot, nothing kept (the policies use
    ``FragmentationMemo``, which is tested to give the same). Column g is the growth with a shared
    request on GPU g (+inf where it does not fit); for other requests every column holds the same value
    (the GPUs they take do not change the result).
    Rounded to a millionth of a milli: the weighted sums over shapes differ in their last bits with the
    number of rows computed at once, and a node's growth must not depend on which other rows were
    recomputed with it (the memo recomputes only changed rows); and a zero is always +0.0 (a sum a
    last bit below zero would otherwise round to -0.0, which ``fgd-exact`` shows as "-0").
    """
    return np.round(_frag_growth(snapshot, request, shapes, rows, measure), 6) + 0.0  # -0.0 too is 0.0


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


def sigmoid_score(growth: np.ndarray) -> np.ndarray:
    """The published FGD score: int64(sigmoid(-growth / 1000) * 100)."""
    with np.errstate(over="ignore"):
        return np.trunc(MAX_NODE_SCORE / (1.0 + np.exp(growth / 1000.0)))


def best_per_node(per_gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's best value and its first GPU among equals, as the artifact picks; (R,) values stand
    for every GPU of their row (GPU 0 then)."""
    if per_gpu.ndim == 1:
        return per_gpu, np.zeros(per_gpu.shape, dtype=np.intp)
    best_gpu = per_gpu.argmax(axis=1)
    return per_gpu[np.arange(best_gpu.size), best_gpu], best_gpu


def fgd_scores(growth: np.ndarray) -> np.ndarray:
    """FGD's per-GPU score of growth; -inf where the request does not fit."""
    return np.where(np.isinf(growth), -np.inf, sigmoid_score(growth))


def best_fgd_score(growth: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Each row's best FGD score and GPU (a ``FragmentationMemo.derive``)."""
    if kernel.available():
        return kernel.best(growth[0], None, 0.0, 0.0, 0.0)
    return best_per_node(fgd_scores(growth[0]))


def _best_negative_growth(growth: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    return best_per_node(np.where(np.isinf(growth[0]), -np.inf, -growth[0]))


@dataclass(eq=False)
class FgdPolicy:
    """FGD as published: least fragmentation growth, scored through a truncated sigmoid, against
    the most popular shapes covering ``popularity`` of the workload (the artifact's typical pods).

    The memo keeps each node's best score and GPU per request shape, so a decision reads them."""

    workload: WorkloadDistribution
    name: str = "fgd"
    quantized: bool = True
    popularity: float = 0.95
    memo: FragmentationMemo = field(init=False)

    def __post_init__(self) -> None:
        derive = best_fgd_score if self.quantized else _best_negative_growth
        self.memo = FragmentationMemo(self.workload.most_popular(self.popularity), derive=derive)

    @property
    def meaning(self) -> str:
        """What a score is (a decision's reason says it)."""
        return "FGD score" if self.quantized else "-(fragmentation growth, milli)"

    def choose(self, snapshot: ClusterSnapshot, request: PodRequest, allowed: np.ndarray | None,
               salt: int | None) -> kernel.Choice | None:  # fmt: skip
        """The decision ``score`` and ``place`` would make, in one kernel call (``kernel.choose``)."""
        return self.memo.choose(snapshot, request, allowed, salt, _NO_SECONDARY)

    def fast(self, request: PodRequest) -> bool:
        """Whether ``choose`` may decide ``request`` (the published, truncated score only)."""
        return self.quantized and kernel.available() and not isinstance(request.gpu, MigSlice)

    def score(self, candidates: Candidates) -> NodeScores:
        request, nodes = candidates.request, candidates.nodes
        if isinstance(request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        best, best_gpu = self.memo.refresh(candidates.snapshot, request, nodes).derived
        share = best_gpu[nodes] if isinstance(request.gpu, GpuShare) else None
        return NodeScores(best[nodes], share, meaning=self.meaning)
