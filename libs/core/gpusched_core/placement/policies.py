"""Scoring policies: the ``PlacementPolicy`` protocol and the published baselines.

A policy scores the feasible nodes of one request (higher is better) and may name the GPU a shared
request should use. The engine picks the best score; ties go to the first node in snapshot order, or
by a seeded hash when the caller passes ``tie_break_seed``. Policies never mutate the snapshot; memo
caches inside a policy are keyed on content and change no result.

The baselines reproduce the score formulas of the FGD artifact (USENIX ATC'23), integer truncation
included, because the truncation decides which nodes tie:

- ``random``: one uniformly random feasible node (seeded, per request).
- ``bestfit``: least leftover ``0.5 * cpu/max_cpu + 0.5 * gpu/max_gpu`` after placing.
- ``packing``: shared GPUs first, then used nodes, then idle nodes.
- ``dotprod``: smallest dot product of free and requested (cpu, gpu), normalised by the largest node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from . import tiebreak
from .feasibility import gpu_free_for, mig_start_free
from .model import MILLI_PER_GPU, GpuShare, MigSlice, PodRequest, WholeGpus
from .snapshot import ClusterSnapshot

MAX_NODE_SCORE = 100


class Candidates:
    """The feasible nodes of one request: node indices (ascending) and, computed on first use, the
    GPU milli free on the GPUs each offers it."""

    __slots__ = ("snapshot", "request", "nodes", "_gpu_free")

    def __init__(self, snapshot: ClusterSnapshot, request: PodRequest, nodes: np.ndarray) -> None:
        self.snapshot = snapshot
        self.request = request
        self.nodes = nodes
        self._gpu_free: np.ndarray | None = None

    @property
    def gpu_free(self) -> np.ndarray:
        """(candidates, gpus) milli free on GPUs of an allowed model, usable for whole or shared GPUs."""
        if self._gpu_free is None:
            self._gpu_free = gpu_free_for(self.snapshot, self.request)[self.nodes]
        return self._gpu_free

    @property
    def cpu_free(self) -> np.ndarray:
        return self.snapshot.cpu_free[self.nodes]

    @property
    def gpu_free_total(self) -> np.ndarray:
        return self.snapshot.share_free_total[self.nodes]


@dataclass(frozen=True, eq=False)
class NodeScores:
    """Scores of the candidates (higher wins) and, for a shared request, the GPU to use on each."""

    values: np.ndarray
    share_gpu: np.ndarray | None = None
    meaning: str = "score"


@runtime_checkable
class PlacementPolicy(Protocol):
    """A node scorer chosen by name. ``score`` must be deterministic in its inputs."""

    @property
    def name(self) -> str: ...

    def score(self, candidates: Candidates) -> NodeScores: ...


def request_gpu_milli(request: PodRequest) -> tuple[int, int]:
    """(milli per GPU, GPU count) of a whole or shared request; (0, 0) otherwise."""
    gpu = request.gpu
    if isinstance(gpu, WholeGpus):
        return MILLI_PER_GPU, gpu.count
    if isinstance(gpu, GpuShare):
        return gpu.milli, 1
    return 0, 0


def mig_packing_scores(candidates: Candidates) -> NodeScores:
    """For MIG requests: prefer nodes whose eligible MIG GPUs have the fewest free start positions."""
    gpu = candidates.request.gpu
    assert isinstance(gpu, MigSlice)
    free_positions = mig_start_free(candidates.snapshot, gpu.profile)[candidates.nodes].sum(axis=(1, 2))
    return NodeScores(-free_positions.astype(np.float64), meaning="-(free MIG positions)")


def _truncate(values: np.ndarray) -> np.ndarray:
    """Go's int64(float) conversion: truncation toward zero."""
    return np.trunc(values)


@dataclass(frozen=True)
class RandomPolicy:
    """A uniformly random feasible node and, for shared requests, a random fitting GPU."""

    seed: int = 0
    name: str = "random"

    def score(self, candidates: Candidates) -> NodeScores:
        salt = tiebreak.salt_for(candidates.request.id, self.seed ^ 0x5EED)
        node_keys = tiebreak.keys(candidates.nodes, salt) >> np.uint64(11)
        values = -node_keys.astype(np.float64)
        share = None
        if isinstance(candidates.request.gpu, GpuShare):
            width = candidates.gpu_free.shape[1]
            flat = candidates.nodes[:, None] * width + np.arange(width)[None, :]
            gpu_keys = tiebreak.keys(flat, salt ^ 0xA5A5).astype(np.float64)
            gpu_keys[candidates.gpu_free < candidates.request.gpu.milli] = np.inf
            share = gpu_keys.argmin(axis=1)
        return NodeScores(values, share, meaning="random key")


@dataclass(frozen=True)
class BestFitPolicy:
    """Least weighted leftover of CPU and GPU after placing (0.5/0.5, normalised by the largest node)."""

    name: str = "bestfit"
    cpu_weight: float = 0.5
    gpu_weight: float = 0.5

    def score(self, candidates: Candidates) -> NodeScores:
        if isinstance(candidates.request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        layout = candidates.snapshot.layout
        milli, count = request_gpu_milli(candidates.request)
        cpu_left = (candidates.cpu_free - candidates.request.cpu_milli) / layout.max_cpu_milli * self.cpu_weight
        gpu_left = (candidates.gpu_free_total - milli * count) / layout.max_gpu_milli * self.gpu_weight
        values = _truncate((1.0 - (cpu_left + gpu_left)) * MAX_NODE_SCORE)
        return NodeScores(values, meaning="bestfit score")


@dataclass(frozen=True)
class DotProductPolicy:
    """Tetris-style alignment of free and requested (CPU, GPU), as configured in the FGD artifact."""

    name: str = "dotprod"

    def score(self, candidates: Candidates) -> NodeScores:
        if isinstance(candidates.request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        layout = candidates.snapshot.layout
        milli, count = request_gpu_milli(candidates.request)
        cpu_max, gpu_max = layout.max_cpu_milli, layout.max_gpu_milli
        dot = (candidates.cpu_free / cpu_max) * (candidates.request.cpu_milli / cpu_max)
        dot = dot + (candidates.gpu_free_total / gpu_max) * (milli * count / gpu_max)
        values = _truncate(MAX_NODE_SCORE * (1.0 - dot / 2.0))
        return NodeScores(values, meaning="dot-product score")


@dataclass(frozen=True)
class PackingPolicy:
    """GPU packing: use shared GPUs (by least free), then free GPUs of used nodes, then idle nodes."""

    name: str = "packing"

    def score(self, candidates: Candidates) -> NodeScores:
        request = candidates.request
        if isinstance(request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        milli, count = request_gpu_milli(request)
        if count == 0:
            return NodeScores(np.zeros(candidates.nodes.size), meaning="packing score")
        free = candidates.gpu_free
        gpu_total = candidates.snapshot.layout.gpu_count[candidates.nodes]
        full = (free == MILLI_PER_GPU).sum(axis=1)
        idle_node = full == gpu_total
        idle_score = np.maximum(MAX_NODE_SCORE // 3 - full, full)
        if count > 1 or milli == MILLI_PER_GPU:
            used_node_score = np.maximum(MAX_NODE_SCORE // 2 - count, MAX_NODE_SCORE // 3)
            values = np.where(idle_node, idle_score, used_node_score)
        else:
            fitting = np.where(free >= milli, free, MILLI_PER_GPU + 1)
            chosen = fitting.min(axis=1)
            shared = np.maximum(MAX_NODE_SCORE - (chosen * 100 // MILLI_PER_GPU) // 10, MAX_NODE_SCORE // 2)
            values = np.where(chosen == MILLI_PER_GPU, MAX_NODE_SCORE // 2 - 1, shared)
            values = np.where(idle_node, idle_score, values)
        return NodeScores(values.astype(np.float64), meaning="packing score")
