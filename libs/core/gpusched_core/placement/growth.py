"""Fragmentation growth from per-node statistics kept per GPU group (what ``FragmentationMemo`` computes).

The reference (``fgd.frag_growth``) recomputes, for each node and each typical shape, how many GPUs
could host one of the shape's GPUs and their free milli, before and after the placement. Both depend
only on the milli a shape asks per GPU and the models it allows, its *group*: a dozen groups stand for
30-70 typical shapes. So the statistics are computed per group (``row_stats``, kept per node by
``RowState`` while the node does not change), a placement changes them only on the GPUs it takes (a
share: one GPU; whole GPUs: fully free ones), and the shapes' CPU and GPU counts turn them into usable
milli with the reference's own formula (``usable_from_stats``). A node's fragmentation before a
placement does not depend on the request: ``RowState`` keeps it per node, once per node state.

Results equal the reference's after its rounding to a millionth of a milli (the sums run in another
order and may differ in their last bits; ``frag_growth`` rounds for the same reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fragmentation import MEASURES, ShapeArrays, WorkloadDistribution, usable_by_measure
from .layout import ClusterLayout
from .model import MILLI_PER_GPU, GpuShare, PodRequest, WholeGpus
from .snapshot import ClusterSnapshot


@dataclass(frozen=True, eq=False)
class GrowthTables:
    """A typical workload's GPU shapes grouped by (milli per GPU, allowed models) over one layout."""

    layout: ClusterLayout
    shapes: ShapeArrays  # the GPU shapes' CPU, milli, count and weight (``gpu_ok`` unused: groups hold it)
    shape_group: np.ndarray  # (T,) group of each shape
    group_milli: np.ndarray  # (H,) milli per GPU of each group
    group_ok: np.ndarray  # (models + 1, H) GPUs of model z may host the group (z = models: no GPU there)
    gpu_model: np.ndarray  # (nodes, gpus) model id of each GPU, len(models) where there is none
    cpu_breaks: dict[str, np.ndarray]  # per measure: free CPU values where some shape's result may change
    _class_tables: dict[tuple[str, ...], tuple[np.ndarray, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, workload: WorkloadDistribution, layout: ClusterLayout) -> GrowthTables:
        pairs = [(s, w) for s, w in zip(workload.shapes, workload.weights, strict=True) if s.gpu_count > 0]
        groups: dict[tuple[int, frozenset[str]], int] = {}
        shape_group = [groups.setdefault((s.gpu_milli, s.allowed_models), len(groups)) for s, _ in pairs]
        size = len(layout.models)
        ok = np.zeros((size + 1, len(groups)), dtype=bool)
        for (_, models), h in groups.items():
            ok[:size, h] = [not models or model in models for model in layout.models]
            ok[size, h] = not models  # as the reference: a shape limited to models has no GPU where none is
        shapes = ShapeArrays(
            cpu=np.array([s.cpu_milli for s, _ in pairs], dtype=np.int64),
            milli=np.array([s.gpu_milli for s, _ in pairs], dtype=np.int64),
            count=np.array([s.gpu_count for s, _ in pairs], dtype=np.int64),
            weight=np.array([w for _, w in pairs], dtype=np.float64),
            gpu_ok=None,
            mig=(),
        )
        breaks = {measure: _cpu_breaks(shapes, layout.max_gpus, measure) for measure in MEASURES}
        return cls(layout, shapes, np.array(shape_group, dtype=np.intp),
                   np.array([milli for milli, _ in groups], dtype=np.int64), ok,
                   np.where(layout.gpu_present, layout.gpu_model, size).astype(np.intp), breaks)  # fmt: skip

    def cpu_breaks_for(self, measures: tuple[str, ...]) -> np.ndarray:
        """Free CPU values where some shape's result may change under any of ``measures``."""
        return np.unique(np.concatenate([self.cpu_breaks[m] for m in measures]))

    def serves(self, layout: ClusterLayout) -> bool:
        """Whether these tables hold for ``layout`` too: the same GPU models at the same places (what a
        node's growth depends on besides its free capacity)."""
        mine = self.layout
        return layout is mine or (layout.models == mine.models and layout.gpu_present.shape == mine.gpu_present.shape
                                  and np.array_equal(layout.gpu_present, mine.gpu_present)
                                  and np.array_equal(layout.gpu_model, mine.gpu_model))  # fmt: skip

    def hosts(self, free: np.ndarray, models: np.ndarray) -> np.ndarray:
        """(..., gpus, H) which GPUs could host one GPU of each group, for free milli (..., gpus)."""
        return (free[..., None] >= self.group_milli) & self.group_ok[models]

    def row_stats(self, free: np.ndarray, models: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(R, H) per group: GPUs that could host one of its GPUs, and their free milli, for free milli
        (R, gpus) (sums over GPUs as products: numpy reduces a short middle axis slowly)."""
        hosts = self.hosts(free, models).astype(np.int64)
        return np.matmul(np.ones_like(free[:1]), hosts)[:, 0, :], np.matmul(free[:, None, :], hosts)[:, 0, :]

    def usable(self, count: np.ndarray, usable: np.ndarray, cpu: np.ndarray,
               measures: tuple[str, ...]) -> tuple[np.ndarray, ...]:  # fmt: skip
        """sum_t p_t * usable_t per measure, from per-group statistics (..., H) and free CPU (...).

        What free CPU decides (whether a shape's CPU fits, its cap) is the same for every free CPU
        between two ``cpu_breaks``: it is read from a table per CPU class instead of dividing per
        shape and node; the sums then run on the same numbers as ``usable_by_measure``'s."""
        group = self.shape_group
        if self.shapes.weight.size == 0 or any(m not in MEASURES for m in measures):
            return usable_by_measure(count[..., group], usable[..., group], cpu, self.shapes, measures)
        breaks, cpu_fits, cap = self.cpu_class_tables(measures)
        cpu_class = breaks.searchsorted(cpu, side="right")
        count, usable = count[..., group], usable[..., group]
        placeable = cpu_fits[cpu_class] & (count >= self.shapes.count)
        weight = self.shapes.weight
        return tuple((placeable * (np.minimum(usable, cap[cpu_class]) if m == "capped" else usable)) @ weight
                     for m in measures)  # fmt: skip

    def cpu_class_tables(self, measures: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(breaks, fits, cap): free CPU ``c`` is in class ``searchsorted(breaks, c, "right")``; per class
        and shape, whether its CPU fits and the most GPU milli ``capped`` lets it use (``cap_per_request``
        times the requests the CPU admits, no more than a node's most free milli, which no ``usable``
        exceeds: so the minimum with it is ``usable_by_measure``'s). Negative free CPU (class 0) fits
        nothing: its cap is never read. Built once per set of measures."""
        key = tuple(sorted(set(measures)))
        tables = self._class_tables.get(key)
        if tables is None:
            breaks = self.cpu_breaks_for(key)
            shapes = self.shapes
            low = np.concatenate([[-1], breaks])[:, None]  # a free CPU of each class
            fits = low >= shapes.cpu
            requests = np.maximum(low, 0) // np.maximum(shapes.cpu, 1) + shapes.cpu_free_request
            cap = np.minimum(requests * shapes.cap_per_request, self.layout.max_gpus * MILLI_PER_GPU)
            tables = self._class_tables[key] = (breaks, fits, cap)
        return tables

    def fragmentation(self, total: np.ndarray, count: np.ndarray, usable: np.ndarray, cpu: np.ndarray,
                      measures: tuple[str, ...]) -> tuple[np.ndarray, ...]:  # fmt: skip
        """(R,) per measure: fragmented milli of nodes with ``total`` free milli and statistics (R, H)."""
        return tuple(total - values for values in self.usable(count, usable, cpu, measures))


_DEDUPE_PAIRS_FROM = 64  # (node, GPU) pairs from which finding equal ones pays


def _cpu_breaks(shapes: ShapeArrays, max_gpus: int, measure: str) -> np.ndarray:
    """Sorted free CPU values at which a shape's usable milli can change: where it starts to fit
    (``fgd``), and where one more request of it fits while the cap is below the most free milli a node
    can have (``capped``: beyond, the cap no longer binds). A negative free CPU fits nothing."""
    points = {0, *shapes.cpu.tolist()}
    if measure == "capped":
        most = max_gpus * MILLI_PER_GPU
        for cpu, milli, count in zip(shapes.cpu.tolist(), shapes.milli.tolist(), shapes.count.tolist(), strict=True):
            if cpu > 0:
                points.update(cpu * j for j in range(1, -(-most // max(milli * count, 1)) + 1))
    return np.array(sorted(points), dtype=np.int64)


def growth_rows(tables: GrowthTables, snapshot: ClusterSnapshot, request: PodRequest, rows: np.ndarray,
                stats: tuple[np.ndarray, np.ndarray], before: tuple[np.ndarray, ...],
                measures: tuple[str, ...]) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Per measure, growth (milli, rounded to 1e-6 as ``fgd.frag_growth``) of the fragmentation of nodes
    ``rows`` if ``request`` goes there: (R, gpus) for a share (column g: on GPU g; +inf where it does not
    fit), else (R,).

    ``stats`` and ``before`` are the rows' current group statistics and fragmentation per measure
    (``RowState``).
    """
    free = snapshot.share_free[rows].astype(np.int64)
    cpu_after = snapshot.cpu_free[rows] - request.cpu_milli
    count, usable = stats
    gpu = request.gpu
    if isinstance(gpu, GpuShare):
        return _share_growth(tables, snapshot, request, rows, free, cpu_after, stats, before, measures)
    total = snapshot.share_free_total[rows]
    if isinstance(gpu, WholeGpus):
        allowed = free if not request.allowed_models else np.where(_allowed(tables, request)[rows], free, 0)
        full = allowed == MILLI_PER_GPU
        taken = full & (full.cumsum(axis=1) <= gpu.count)
        count, usable = tables.row_stats(np.where(taken, 0, free), tables.gpu_model[rows])
        total = total - MILLI_PER_GPU * taken.sum(axis=1)
    afters = tables.usable(count, usable, cpu_after, measures)
    return tuple(_rounded(total - np.array(afters) - np.array(before)))


def _allowed(tables: GrowthTables, request: PodRequest) -> np.ndarray:
    return tables.layout.model_mask(request.allowed_models)


def _share_growth(tables: GrowthTables, snapshot: ClusterSnapshot, request: PodRequest, rows: np.ndarray,
                  free: np.ndarray, cpu_after: np.ndarray, stats: tuple[np.ndarray, np.ndarray],
                  before: tuple[np.ndarray, ...], measures: tuple[str, ...]) -> tuple[np.ndarray, ...]:  # fmt: skip
    """Placing on GPU g changes only GPU g: its group statistics move by what that GPU hosted. GPUs of a
    node with the same model and free milli give the same growth: each is computed once."""
    gpu = request.gpu
    assert isinstance(gpu, GpuShare)
    allowed = free if not request.allowed_models else np.where(_allowed(tables, request)[rows], free, 0)
    fits = allowed >= gpu.milli
    if gpu.memory_mib:
        fits &= snapshot.gpu_memory_free[rows] >= gpu.memory_mib
    where = fits.ravel().nonzero()[0]  # (node, GPU) pairs, flattened
    row = where // free.shape[1]
    milli, model = free.ravel()[where], tables.gpu_model[rows].ravel()[where]
    inverse = None
    if where.size >= _DEDUPE_PAIRS_FROM:
        kinds = len(tables.group_ok)
        first, inverse = first_and_inverse((row * (MILLI_PER_GPU + 1) + milli) * kinds + model)
        row, milli, model = row[first], milli[first], model[first]
    left = milli - gpu.milli
    ok = tables.group_ok[model]
    was, now = (milli[:, None] >= tables.group_milli) & ok, (left[:, None] >= tables.group_milli) & ok  # (P, H)
    count = stats[0][row] - was + now
    usable = stats[1][row] - milli[:, None] * was + left[:, None] * now
    total = snapshot.share_free_total[rows[row]] - gpu.milli
    afters = tables.usable(count, usable, cpu_after[row], measures)
    values = _rounded(total - np.array(afters) - np.array(before)[:, row])  # (measures, P)
    growth = np.full((len(measures), free.size), np.inf)
    growth[:, where] = values if inverse is None else values[:, inverse]
    return tuple(growth.reshape(len(measures), *free.shape))


def first_and_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_index=True, return_inverse=True)[1:]`` for 1-d ``keys``, the same way
    (a stable sort: each distinct key's first position, in key order), without its call overhead,
    which is most of its cost on the few dozen keys of a decision."""
    order = keys.argsort(kind="stable")
    ordered = keys[order]
    new = np.empty(ordered.size, dtype=bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    inverse = np.empty(ordered.size, dtype=np.intp)
    inverse[order] = new.cumsum() - 1
    return order[new], inverse


def _rounded(growth: np.ndarray) -> np.ndarray:
    """To a millionth of a milli, as ``fgd.frag_growth`` (a zero as +0.0). (``np.array`` stacks the
    measures above and the method rounds: the same numbers as ``np.stack`` and ``np.round``, with less
    call overhead on the few rows of a decision.)"""
    return growth.round(6) + 0.0
