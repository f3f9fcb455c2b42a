"""Memo of fragmentation growth per request shape, refreshed only on nodes that changed and are asked for.

``RowState`` follows the snapshots a policy is shown and gives each node that changed a new version.
Each shape's memo keeps, per node, the growth under each measure and the version it was computed at;
a node is recomputed when its version moved *and* a decision asks for it. Nodes in the same state
(the same GPUs and free GPU milli, free CPU in the same class before and after:
``RowState.classes``) have the same growth, so a large refresh (a shape's first use) computes each
state once.

``derive`` (optional) turns growth rows into per-node values a policy reads on every decision (its
best score and GPU): they are recomputed with the growth, so they never go stale either.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import kernel
from .fragmentation import WorkloadDistribution
from .growth import GrowthTables, first_and_inverse, growth_rows
from .model import GpuShare, PodRequest
from .row_state import RowState
from .snapshot import ClusterSnapshot

__all__ = ["Derive", "FragmentationMemo", "RowState"]

_MAX_CACHED_SHAPES = 512
_DEDUPE_FROM = 48  # nodes to refresh from which finding equal node states pays

# growth rows per measure -> per-node values (R,) or (R, ...)
Derive = Callable[[tuple[np.ndarray, ...]], tuple[np.ndarray, ...]]


def _asks_memory(request: PodRequest) -> bool:
    return isinstance(request.gpu, GpuShare) and request.gpu.memory_mib > 0


@dataclass(eq=False)
class _Entry:
    tables: GrowthTables  # the layout (or layouts alike) its rows are nodes of
    growth: tuple[np.ndarray, ...]  # per measure: (nodes, gpus) for a share, (nodes,) otherwise
    version: np.ndarray  # (nodes,) the node version each row was computed at (0: never)
    derived: tuple[np.ndarray, ...] = ()
    kernel_args: tuple[object, ...] | None = None  # ``kernel.choose``'s arguments of this shape (built once)


def _stale(entry: _Entry, version: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """The ``nodes`` (ascending) whose version moved since ``entry`` computed them."""
    moved = (entry.version != version).nonzero()[0]
    if moved.size * 4 > nodes.size:  # many (a first use): look the nodes up instead
        return nodes[entry.version[nodes] != version[nodes]]
    if moved.size == 0:
        return moved
    position = np.minimum(nodes.searchsorted(moved), nodes.size - 1)
    return moved[nodes[position] == moved]


@dataclass(eq=False)
class FragmentationMemo:
    """Per-shape memo of fragmentation growth under ``measures`` (see the module doc)."""

    workload: WorkloadDistribution
    measures: tuple[str, ...] = ("fgd",)
    derive: Derive | None = None
    rows: RowState = field(init=False)
    _entries: OrderedDict[tuple[object, ...], _Entry] = field(default_factory=OrderedDict)
    scratch: dict[int, tuple[np.ndarray, ...]] = field(default_factory=dict)  # ``kernel.choose``'s, per node count
    kernel_args: tuple[object, ...] | None = None  # ``kernel.choose``'s arguments kept while the node state is

    def __post_init__(self) -> None:
        self.rows = RowState(self.workload)

    def refresh(self, snapshot: ClusterSnapshot, request: PodRequest, nodes: np.ndarray) -> _Entry:
        """The memo of ``request``'s shape, current on ``nodes`` (ascending node indices)."""
        rows = self.rows
        tables = self.sync(snapshot, request)
        entry = self._entry(tables, request)
        stale = _stale(entry, rows.version, nodes)
        if stale.size:
            growth, derived = self._compute(tables, snapshot, request, stale)
            for target, values in zip((*entry.growth, *entry.derived), (*growth, *derived), strict=True):
                target[stale] = values
            entry.version[stale] = rows.version[stale]
        return entry

    def _compute(self, tables: GrowthTables, snapshot: ClusterSnapshot, request: PodRequest,
                 stale: np.ndarray) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:  # fmt: skip
        """Growth and derived values of ``stale`` nodes, each node state once when there are many (GPU
        memory, which a state leaves out, is then compared node by node)."""
        rows = self.rows
        if kernel.available() and kernel.supports(tables) and all(m in rows.before for m in self.measures):
            growth = kernel.growth(tables, snapshot, request, stale, rows.count, rows.usable, rows.before,
                                   self.measures)  # fmt: skip
            return growth, (() if self.derive is None else self.derive(growth))
        unique = inverse = None
        if stale.size >= _DEDUPE_FROM and not _asks_memory(request):
            first, inverse = first_and_inverse(rows.classes(stale, request.cpu_milli))
            if first.size < stale.size:
                unique = stale[first]
        chosen = stale if unique is None else unique
        before = tuple(rows.before[measure][chosen] for measure in self.measures)
        stats = (rows.count[chosen], rows.usable[chosen])
        growth = growth_rows(tables, snapshot, request, chosen, stats, before, self.measures)
        derived = () if self.derive is None else self.derive(growth)
        if unique is None:
            return growth, derived
        return tuple(values[inverse] for values in growth), tuple(values[inverse] for values in derived)

    def sync(self, snapshot: ClusterSnapshot, request: PodRequest) -> GrowthTables:
        """Every node's kept state brought up to ``snapshot`` (``RowState.sync``) for ``request``'s kind."""
        return self.rows.sync(snapshot, self.measures, _asks_memory(request))

    def choose(self, snapshot: ClusterSnapshot, request: PodRequest, allowed: np.ndarray | None, salt: int | None,
               derive: kernel.Derive, memory_ratio: float = 0.0, memory_weight: float = 0.0,
               scarcity: Callable[[ClusterSnapshot], tuple[object, ...] | None] | None = None,
               ) -> kernel.Choice | None:  # fmt: skip
        """``kernel.choose`` on ``snapshot``, the kept node state brought up to it in the same call
        (``RowState.begin``/``end``). ``scarcity(at)``: the scarcity inputs with the free GPU per class as of
        ``at``, the snapshot the state steps from (the kernel steps those sums too)."""
        rows = self.rows
        tables, old, among = rows.begin(snapshot, self.measures, _asks_memory(request))
        inputs = None if scarcity is None else scarcity(snapshot if old is None else old)
        step = None
        if old is not None:
            class_free = None if inputs is None else (inputs[4], inputs[2])  # (node classes, free per class)
            step = kernel.step_inputs(tables, old, snapshot, rows.memory, among, rows.version,
                                      rows.clock + 1, rows.count, rows.usable, rows.before, rows.cpu_class, None,
                                      class_free)  # fmt: skip
        try:
            choice = kernel.choose(self, tables, snapshot, request, allowed, derive, inputs, memory_ratio,
                                   memory_weight, salt, step)  # fmt: skip
        except BaseException:
            rows.snapshot = None  # a call that failed may have stepped some nodes: start over next time
            raise
        if choice is kernel.UNSUPPORTED:  # tables beyond the kernel: kept by numpy (``begin`` stepped them)
            return choice
        if old is not None:
            rows.end(snapshot, old, choice.changed)
        return None if choice.feasible == 0 else choice

    def entry(self, tables: GrowthTables, request: PodRequest) -> _Entry:
        """The memo of ``request``'s shape over ``tables`` (rows not refreshed: ``kernel.choose`` does)."""
        return self._entry(tables, request)

    def _entry(self, tables: GrowthTables, request: PodRequest) -> _Entry:
        key = (request.gpu, request.cpu_milli, request.allowed_models)
        entry = self._entries.get(key)
        if entry is not None and entry.tables is tables:
            self._entries.move_to_end(key)
            return entry
        count = tables.layout.node_count
        shape = (count, tables.layout.max_gpus) if isinstance(request.gpu, GpuShare) else (count,)
        growth = tuple(np.zeros(shape) for _ in self.measures)
        entry = _Entry(tables, growth, np.zeros(count, dtype=np.int64))
        if self.derive is not None:
            empty = self.derive(tuple(values[:0] for values in growth))
            entry.derived = tuple(np.zeros((count, *a.shape[1:]), dtype=a.dtype) for a in empty)
        self._entries[key] = entry
        if len(self._entries) > _MAX_CACHED_SHAPES:
            self._entries.popitem(last=False)
        return entry

    def growth_at(self, snapshot: ClusterSnapshot, request: PodRequest, nodes: np.ndarray,
                  measure: str | None = None) -> np.ndarray:  # fmt: skip
        """(len(nodes), gpus) growth on ``nodes`` under ``measure`` (the first kept when None); columns
        equal unless a share (see ``frag_growth``)."""
        position = 0 if measure is None else self.measures.index(measure)
        growth = self.refresh(snapshot, request, nodes).growth[position][nodes]
        if growth.ndim == 1:
            return np.repeat(growth[:, None], snapshot.layout.max_gpus, axis=1)
        return growth

    def growth(self, snapshot: ClusterSnapshot, request: PodRequest, measure: str | None = None) -> np.ndarray:
        """(nodes, gpus) growth for every node (values of infeasible nodes are meaningless)."""
        return self.growth_at(snapshot, request, np.arange(snapshot.layout.node_count), measure)
