"""Per-node state of the last snapshot a policy was shown, kept in step node by node.

``RowState.sync`` finds the nodes whose free CPU or share-usable GPU milli (or GPU memory, once a
request asks for it) differ from the last snapshot's: a content comparison, never a version counter
kept in snapshots, so any lineage of snapshots (what-if copies, a gang's scratch binds) is safe, and
so is a snapshot rebuilt from the store over the same nodes and GPUs (a new layout object: the live
service loads one whenever another process changed the cluster). Each
changed node gets a new version, and its group statistics, fragmentation per measure, free CPU class
and state id are recomputed: once per node state, for every request shape.
"""

from __future__ import annotations

import numpy as np

from . import kernel
from .fragmentation import WorkloadDistribution
from .growth import GrowthTables
from .layout import ClusterLayout
from .snapshot import ClusterSnapshot


def changed_rows(old: ClusterSnapshot, new: ClusterSnapshot, memory: bool) -> np.ndarray:
    """Nodes whose free CPU or share-usable GPU milli (and GPU memory when ``memory``) differ: among the
    nodes the updates from ``old`` to ``new`` touched where ``new``'s lineage tells them (a decision's
    node or two instead of a pass over every node), else among all."""
    among = new.touched_since(old) if old.layout is new.layout else None
    if among is not None:
        mark = old.cpu_free[among] != new.cpu_free[among]
        mark |= (old.share_free[among] != new.share_free[among]).any(axis=1)
        if memory:
            mark |= (old.gpu_memory_free[among] != new.gpu_memory_free[among]).any(axis=1)
        return among[mark]
    mark = old.cpu_free != new.cpu_free
    mark[_rows_differing(old.share_free, new.share_free)] = True
    if memory:
        mark[_rows_differing(old.gpu_memory_free, new.gpu_memory_free)] = True
    return mark.nonzero()[0]


def _rows_differing(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Rows (maybe repeated) where two (nodes, gpus) arrays differ; compared 8 bytes at a time when rows
    allow it (a node's 8 GPUs of int32 milli: 4 comparisons instead of 8)."""
    row_bytes = old.shape[1] * old.itemsize
    if row_bytes % 8 == 0 and old.dtype == new.dtype and old.flags.c_contiguous and new.flags.c_contiguous:
        old, new = old.view(np.int64), new.view(np.int64)
    return (old != new).ravel().nonzero()[0] // old.shape[1]


class RowState:
    """Per node of the last snapshot shown: a version, group statistics, fragmentation per measure, a
    free CPU class (equal classes: equal results under every measure kept) and, for numpy, a state id
    (equal ids: the same GPU models and free GPU milli; the C kernel compares the nodes themselves)."""

    def __init__(self, workload: WorkloadDistribution) -> None:
        self.workload = workload
        self.measures: tuple[str, ...] = ()
        self.tables: GrowthTables | None = None
        self.snapshot: ClusterSnapshot | None = None
        self.clock = 0
        self.version = self.state = self.cpu_class = np.zeros(0, dtype=np.int64)
        self.count = self.usable = np.zeros((0, 0), dtype=np.int64)
        self.before: dict[str, np.ndarray] = {}
        self.breaks = np.zeros(1, dtype=np.int64)
        self.memory = False  # GPU memory compared too (from the first request that asks for some)
        self.in_c = kernel.available()  # kept by the C kernel: no state ids (its choice compares nodes in full)
        self._ids: dict[bytes, int] = {}
        self._asked: tuple[str, ...] | None = None  # the measures last asked for, all kept since
        # (previous snapshot, nodes that differ from it) of the last step in step: what a caller keeping
        # sums over nodes adds up instead of summing again; (None, None) after starting over
        self.last_change: tuple[ClusterSnapshot | None, np.ndarray | None] = (None, None)

    def sync(self, snapshot: ClusterSnapshot, measures: tuple[str, ...], memory: bool = False) -> GrowthTables:
        """Bring every node up to ``snapshot``, keeping ``measures`` too; returns the layout's tables."""
        tables, old, among = self.begin(snapshot, measures, memory)
        if old is not None:  # found and recomputed in one kernel call
            rows = kernel.step(tables, self.measures, old, snapshot, self.memory, among, self.version, self.clock + 1,
                               self.count, self.usable, self.before, self.cpu_class)  # fmt: skip
            self.end(snapshot, old, rows.size, rows)
        return tables

    def begin(self, snapshot: ClusterSnapshot, measures: tuple[str, ...],
              memory: bool = False) -> tuple[GrowthTables, ClusterSnapshot | None, np.ndarray | None]:  # fmt: skip
        """``sync`` up to the kernel's step: (the layout's tables, the snapshot the kernel is to step from and
        the nodes to compare, None for all), or (tables, None, None) where every node is at ``snapshot``
        already or was brought there here (a start over, numpy). After the kernel's step, ``end``."""
        if memory and not self.memory:
            self.memory, self.snapshot = True, None  # start over: earlier memory changes went unseen
        if measures is not self._asked:  # a policy asks with the same tuple every time
            if any(m not in self.before for m in measures):
                self.measures += tuple(m for m in measures if m not in self.before)
                self.snapshot = None  # start over with the new measure (once)
            self._asked = measures
        in_c = kernel.available() and (self.tables is None or kernel.supports(self.tables))
        if self.in_c != in_c:
            self.in_c, self.snapshot = in_c, None  # start over: state ids are kept for numpy alone
        tables, old = self.tables, self.snapshot
        if snapshot is old and tables is not None:
            return tables, None, None
        if tables is None or old is None or not tables.serves(snapshot.layout):
            self._reset(snapshot, snapshot.layout)
            self.last_change = (None, None)
        elif self.in_c and self.measures:
            return tables, old, (snapshot.touched_since(old) if old.layout is snapshot.layout else None)
        else:
            rows = changed_rows(old, snapshot, self.memory)
            self.last_change = (old, rows)
            if rows.size:
                self._recompute(snapshot, rows)
        self.snapshot = snapshot
        assert self.tables is not None
        return self.tables, None, None

    def end(self, snapshot: ClusterSnapshot, old: ClusterSnapshot, changed: int,
            rows: np.ndarray | None = None) -> None:  # fmt: skip
        """The kernel stepped every node from ``old`` (``begin``) to ``snapshot``: ``changed`` of them got
        version ``clock + 1`` (``rows`` where the call said which; else sums over nodes start over)."""
        self.clock += 1 if changed else 0
        self.last_change = (old, rows) if rows is not None else (None, None)
        self.snapshot = snapshot

    def _reset(self, snapshot: ClusterSnapshot, layout: ClusterLayout) -> None:
        if self.tables is None or not self.tables.serves(layout):
            self.tables = GrowthTables.of(self.workload, layout)
        self.in_c = kernel.available() and kernel.supports(self.tables)
        count, groups = layout.node_count, len(self.tables.group_milli)
        self.version, self.state = np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
        self.cpu_class = np.zeros(count, dtype=np.int64)
        self.count, self.usable = np.zeros((count, groups), dtype=np.int64), np.zeros((count, groups), dtype=np.int64)
        self.before = {m: np.zeros(count) for m in self.measures}
        self.breaks = self.tables.cpu_breaks_for(self.measures) if self.measures else np.zeros(1, dtype=np.int64)
        self._ids = {}
        self._recompute(snapshot, np.arange(count))

    def _recompute(self, snapshot: ClusterSnapshot, rows: np.ndarray) -> None:
        tables = self.tables
        assert tables is not None
        self.clock += 1
        self.version[rows] = self.clock
        if self.measures and self.in_c:
            kernel.stats(tables, self.measures, snapshot, rows, self.count, self.usable, self.before, self.cpu_class)
            return
        free = snapshot.share_free[rows].astype(np.int64)
        models = tables.gpu_model[rows]
        count, usable = tables.row_stats(free, models)
        self.count[rows], self.usable[rows] = count, usable
        cpu = snapshot.cpu_free[rows]
        if self.measures:
            fragmentation = tables.fragmentation(snapshot.share_free_total[rows], count, usable, cpu, self.measures)
            for measure, values in zip(self.measures, fragmentation, strict=True):
                self.before[measure][rows] = values
        self.cpu_class[rows] = self.breaks.searchsorted(cpu, side="right")
        if len(self._ids) > 4 * len(self.version) + 1024:  # forget states no node has had for long
            self._ids, rows = {}, np.arange(len(self.version))
            free, models = snapshot.share_free.astype(np.int64), tables.gpu_model
        keys = np.concatenate([models, free], axis=1)
        self.state[rows] = [self._ids.setdefault(key.tobytes(), len(self._ids)) for key in keys]

    def classes(self, rows: np.ndarray, cpu_milli: int) -> np.ndarray:
        """One int per node of ``rows``: equal when the nodes' growth under every kept measure is the
        same for any request asking ``cpu_milli`` CPU and the same GPUs (the same state and free CPU
        class, before and after)."""
        assert self.snapshot is not None
        width = len(self.breaks) + 1
        after = self.breaks.searchsorted(self.snapshot.cpu_free[rows] - cpu_milli, side="right")
        return (self.state[rows] * width + self.cpu_class[rows]) * width + after
