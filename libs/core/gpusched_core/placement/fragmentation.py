"""GPU fragmentation measured against a workload's distribution of requests (FGD, ATC'23).

The fragmentation of a node is the free GPU capacity that a request drawn from the workload could
*not* use there, in expectation over the workload::

    F(node) = free(node) - sum_t p_t * usable_t(node)

where ``usable_t`` is 0 when a request of shape ``t`` cannot be placed on the node at all (CPU short,
wrong GPU model, too few GPUs with enough free milli), and otherwise the free milli of the GPUs
that could each host one of its GPUs (for shared and whole GPUs), or, for a MIG profile, the free
slices some free placement of the profile would cover. CPU-only shapes use no GPU, so all free GPU
capacity counts as fragmented for them, as in the FGD artifact. The cluster's fragmentation is the
sum over nodes; ``fragmentation_pct`` relates it to the cluster's GPU capacity.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .mig import MIG_FAMILIES, MIG_MEMORY_SLICES
from .model import MILLI_PER_GPU, GpuShare, MigSlice, PodRequest, WholeGpus
from .snapshot import MIG_FAMILY_NAMES, ClusterLayout, ClusterSnapshot

MILLI_PER_MIG_SLICE = MILLI_PER_GPU / MIG_MEMORY_SLICES


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What of a request matters to fragmentation (memory does not, as in FGD)."""

    cpu_milli: int
    gpu_milli: int = 0
    gpu_count: int = 0
    allowed_models: frozenset[str] = frozenset()
    mig_profile: str | None = None

    def sort_key(self) -> tuple[int, int, int, str, str]:
        return (self.cpu_milli, self.gpu_milli, self.gpu_count, "|".join(sorted(self.allowed_models)),
                self.mig_profile or "")  # fmt: skip


def shape_of(request: PodRequest) -> RequestShape:
    gpu, models = request.gpu, request.allowed_models
    if isinstance(gpu, WholeGpus):
        return RequestShape(request.cpu_milli, MILLI_PER_GPU, gpu.count, models)
    if isinstance(gpu, GpuShare):
        return RequestShape(request.cpu_milli, gpu.milli, 1, models)
    if isinstance(gpu, MigSlice):
        return RequestShape(request.cpu_milli, 0, 0, models, gpu.profile)
    return RequestShape(request.cpu_milli)


@dataclass(frozen=True, slots=True)
class WorkloadDistribution:
    """Request shapes and their probabilities (summing to 1)."""

    shapes: tuple[RequestShape, ...]
    weights: tuple[float, ...]
    # Memory (MiB) the workload's GPU requests ask per GPU milli, all together (None: not known).
    memory_per_milli: float | None = None

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights) or not self.shapes:
            raise ValueError("a workload needs one weight per shape and at least one shape")
        if abs(sum(self.weights) - 1.0) > 1e-6 or min(self.weights) < 0:
            raise ValueError("workload weights must be >= 0 and sum to 1")
        if self.memory_per_milli is not None and not self.memory_per_milli > 0:
            raise ValueError("memory_per_milli must be > 0 when given")

    def most_popular(self, popularity: float) -> WorkloadDistribution:
        """The most probable shapes that together cover ``popularity``, renormalised (FGD's "typical
        pods"; ties in probability ordered by shape)."""
        ordered = sorted(zip(self.shapes, self.weights, strict=True), key=lambda sw: (-sw[1], sw[0].sort_key()))
        kept: list[tuple[RequestShape, float]] = []
        covered = 0.0
        for shape, weight in ordered:
            if covered >= popularity - 1e-12:
                break
            kept.append((shape, weight))
            covered += weight
        return WorkloadDistribution(tuple(s for s, _ in kept), tuple(w / covered for _, w in kept),
                                    self.memory_per_milli)  # fmt: skip


def workload_from_requests(requests: Iterable[PodRequest], popularity: float = 1.0) -> WorkloadDistribution:
    """The shapes of ``requests`` with their frequencies, most frequent first (ties by shape);
    ``popularity`` < 1 keeps only the most popular shapes covering that share."""
    counts: Counter[RequestShape] = Counter()
    gpu_memory = gpu_milli = 0
    for request in requests:
        counts[shape_of(request)] += 1
        if request.gpu_milli_total > 0:
            gpu_memory += request.memory_mib
            gpu_milli += request.gpu_milli_total
    if not counts:
        raise ValueError("no requests to build a workload from")
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0].sort_key()))
    total = sum(counts.values())
    ratio = gpu_memory / gpu_milli if gpu_memory > 0 else None
    full = WorkloadDistribution(tuple(s for s, _ in ordered), tuple(c / total for _, c in ordered), ratio)
    return full if popularity >= 1.0 else full.most_popular(popularity)


@dataclass(frozen=True, eq=False)
class ShapeArrays:
    """A workload's GPU shapes as arrays for vectorised fragmentation over one layout."""

    cpu: np.ndarray  # (T,)
    milli: np.ndarray  # (T,)
    count: np.ndarray  # (T,)
    weight: np.ndarray  # (T,)
    gpu_ok: np.ndarray | None  # (T, nodes, gpus) GPUs of an allowed model; None when no shape limits models
    mig: tuple[tuple[RequestShape, float], ...]  # MIG shapes, measured separately

    @cached_property
    def cpu_divisors(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct CPU per request (at least 1: what free CPU is divided by under ``capped``), and
        each shape's among them (a few divisions per node instead of one per shape)."""
        values, index = np.unique(np.maximum(self.cpu, 1), return_inverse=True)
        return values, index.reshape(-1)

    @cached_property
    def cap_per_request(self) -> np.ndarray:
        """(T,) GPU milli of one request of each shape; ``_NO_CAP`` for shapes without CPU (their cap
        is then at least ``_NO_CAP``, above any node's GPU milli, for any free CPU >= 0)."""
        return np.where(self.cpu > 0, self.milli * self.count, _NO_CAP)

    @cached_property
    def cpu_free_request(self) -> np.ndarray:
        """(T,) 1 for shapes without CPU (one more request than free CPU // 1), else 0."""
        return (self.cpu == 0).astype(np.int64)


def shape_arrays(workload: WorkloadDistribution, layout: ClusterLayout) -> ShapeArrays:
    gpu_shapes = [(s, w) for s, w in zip(workload.shapes, workload.weights, strict=True) if s.gpu_count > 0]
    mig = tuple((s, w) for s, w in zip(workload.shapes, workload.weights, strict=True) if s.mig_profile)
    gpu_ok = None
    if any(s.allowed_models for s, _ in gpu_shapes):
        gpu_ok = np.stack([layout.model_mask(s.allowed_models) for s, _ in gpu_shapes]) if gpu_shapes else None
    return ShapeArrays(
        cpu=np.array([s.cpu_milli for s, _ in gpu_shapes], dtype=np.int64),
        milli=np.array([s.gpu_milli for s, _ in gpu_shapes], dtype=np.int64),
        count=np.array([s.gpu_count for s, _ in gpu_shapes], dtype=np.int64),
        weight=np.array([w for _, w in gpu_shapes], dtype=np.float64),
        gpu_ok=gpu_ok,
        mig=mig,
    )


MEASURES = ("fgd", "capped")
_NO_CAP = 1 << 32


def shape_stats(free: np.ndarray, shapes: ShapeArrays, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU shape: how many GPUs could each host one of its GPUs, and their free milli.

    ``free`` is (..., gpus); results are (..., T). ``rows`` (the leading shape of ``free`` without
    its last axis) names each entry's node when shapes limit GPU models.
    """
    hosts = free[..., None, :] >= shapes.milli[:, None]  # (..., T, G)
    if shapes.gpu_ok is not None:
        assert rows is not None
        hosts &= np.moveaxis(shapes.gpu_ok[:, rows, :], 0, -2)
    return hosts.sum(axis=-1), (free[..., None, :] * hosts).sum(axis=-1)


def usable_from_stats(count: np.ndarray, usable: np.ndarray, cpu: np.ndarray, shapes: ShapeArrays,
                      measure: str = "fgd") -> np.ndarray:  # fmt: skip
    """sum_t p_t * usable_t from ``shape_stats`` (..., T) and the free CPU (...).

    ``measure``:
      - ``fgd``: as published: all free milli of the GPUs that could each host one GPU of the shape,
        as soon as one request of the shape fits (CPU included);
      - ``capped``: the same, but no more than the GPU milli of as many requests as the node's free
        CPU admits: CPU spent on a node with many free GPUs strands them.
    """
    return usable_by_measure(count, usable, cpu, shapes, (measure,))[0]


def usable_by_measure(count: np.ndarray, usable: np.ndarray, cpu: np.ndarray, shapes: ShapeArrays,
                      measures: tuple[str, ...]) -> tuple[np.ndarray, ...]:  # fmt: skip
    """``usable_from_stats`` under each of ``measures``, sharing what they have in common."""
    for measure in measures:
        if measure not in MEASURES:
            raise ValueError(f"unknown fragmentation measure {measure!r}; known: {', '.join(MEASURES)}")
    if shapes.weight.size == 0:
        return tuple(np.zeros(np.broadcast_shapes(count.shape[:-1], cpu.shape)) for _ in measures)
    cpu_free = cpu[..., None]
    placeable = (cpu_free >= shapes.cpu) & (count >= shapes.count)
    results = []
    for measure in measures:
        capped = usable
        if measure == "capped":  # a shape without CPU is not capped (see ``cap_per_request``)
            divisors, which = shapes.cpu_divisors
            requests = (cpu_free // divisors)[..., which] + shapes.cpu_free_request
            capped = np.minimum(usable, requests * shapes.cap_per_request)
        results.append((placeable * capped) @ shapes.weight)
    return tuple(results)


def usable_milli(free: np.ndarray, cpu: np.ndarray, shapes: ShapeArrays, rows: np.ndarray | None = None,
                 measure: str = "fgd") -> np.ndarray:  # fmt: skip
    """sum_t p_t * usable_t over GPU shapes for free GPU milli (..., gpus) and free CPU (...)."""
    count, usable = shape_stats(free, shapes, rows)
    return usable_from_stats(count, usable, cpu, shapes, measure)


def _mig_usable(snapshot: ClusterSnapshot, shapes: ShapeArrays) -> tuple[np.ndarray, np.ndarray]:
    """(free MIG milli per node, sum_t p_t * usable_t over MIG shapes per node)."""
    layout = snapshot.layout
    enabled = snapshot.gpu_mig_mode & layout.gpu_present & snapshot.gpu_healthy
    free_bits = np.unpackbits((~snapshot.mig_used)[..., None], axis=-1).sum(axis=-1)
    free = np.where(enabled, free_bits, 0).sum(axis=1) * MILLI_PER_MIG_SLICE
    usable = np.zeros(layout.node_count)
    for shape, weight in shapes.mig:
        covered = np.zeros(layout.gpu_present.shape, dtype=np.uint8)
        fits = np.zeros(layout.gpu_present.shape, dtype=bool)
        for family_id, family in enumerate(MIG_FAMILY_NAMES):
            profile = MIG_FAMILIES[family].get(shape.mig_profile or "")
            if profile is None:
                continue
            in_family = enabled & (layout.mig_family == family_id) & layout.model_mask(shape.allowed_models)
            for start in profile.starts:
                mask = np.uint8(profile.mask_at(start))
                free_here = in_family & ((snapshot.mig_used & mask) == 0)
                covered |= np.where(free_here, mask, np.uint8(0)).astype(np.uint8)
                fits |= free_here
        slices = np.unpackbits(covered[..., None], axis=-1).sum(axis=-1).sum(axis=1)
        placeable = fits.any(axis=1) & (snapshot.cpu_free >= shape.cpu_milli)
        usable += weight * placeable * slices * MILLI_PER_MIG_SLICE
    return free, usable


def node_fragmentation(snapshot: ClusterSnapshot, workload: WorkloadDistribution, measure: str = "fgd") -> np.ndarray:
    """(nodes,) fragmented GPU milli of each node against ``workload`` (see ``usable_from_stats``)."""
    shapes = shape_arrays(workload, snapshot.layout)
    rows = np.arange(snapshot.layout.node_count)
    free = snapshot.share_free.astype(np.int64)
    frag = free.sum(axis=1) - usable_milli(free, snapshot.cpu_free, shapes, rows, measure)
    if shapes.mig or snapshot.gpu_mig_mode.any():
        mig_free, mig_usable = _mig_usable(snapshot, shapes)
        frag = frag + mig_free - mig_usable
    return np.maximum(frag, 0.0)


@dataclass(frozen=True, slots=True)
class FragmentationReport:
    """Cluster fragmentation: milli, as % of GPU capacity, and as % of the free GPU milli."""

    fragmented_milli: float
    free_milli: float
    capacity_milli: int

    @property
    def fragmentation_pct(self) -> float:
        return 100.0 * self.fragmented_milli / self.capacity_milli if self.capacity_milli else 0.0

    @property
    def fragmentation_ratio_pct(self) -> float:
        return 100.0 * self.fragmented_milli / self.free_milli if self.free_milli else 0.0


def cluster_fragmentation(snapshot: ClusterSnapshot, workload: WorkloadDistribution,
                          measure: str = "fgd") -> FragmentationReport:  # fmt: skip
    frag = node_fragmentation(snapshot, workload, measure)
    free = float(snapshot.share_free_total.sum())
    if snapshot.gpu_mig_mode.any():
        free += float(_mig_usable(snapshot, shape_arrays(workload, snapshot.layout))[0].sum())
    return FragmentationReport(float(frag.sum()), free, snapshot.gpu_milli_capacity)
