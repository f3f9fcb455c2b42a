"""The cluster snapshot: a static layout of nodes and GPUs plus the free capacity left on them.

Snapshots are immutable values. ``apply`` and ``release`` return a new snapshot and leave the old
one untouched (arrays are copied, a few microseconds per thousand nodes), so a what-if search or a
gang's tentative binds work on copies. The arrays are marked read-only: a policy that tried to write
into them would fail loudly.

Invariant (checked by ``apply``): no CPU, memory, GPU milli, GPU memory or MIG slice is ever granted
beyond capacity, and an allocation id is granted at most once.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
import numpy as np

from .allocations import Allocations
from .layout import MIG_FAMILY_NAMES, ClusterLayout, build_layout, readonly
from .mig import FULL_MIG_MASK, mig_profile
from .model import MILLI_PER_GPU, Binding, Decision, Node, NodeId, PlacementError, RequestId

__all__ = ["MIG_FAMILY_NAMES", "ClusterLayout", "ClusterSnapshot", "apply", "apply_bindings", "build_layout",
           "build_snapshot", "rebuild", "release", "with_gpu_state"]  # fmt: skip


@dataclass(frozen=True, eq=False)
class ClusterSnapshot:
    """Free capacity per node and GPU, and the allocations that consumed the rest.

    ``share_free`` is the milli left on GPUs usable for whole or shared requests (present, healthy,
    not in MIG mode; 0 otherwise). ``full_free_count``, ``max_share_free`` and ``share_free_total``
    are per-node summaries of it, kept in step by every update.
    """

    layout: ClusterLayout
    cpu_free: np.ndarray
    memory_free: np.ndarray
    gpu_milli_free: np.ndarray
    gpu_memory_free: np.ndarray
    mig_used: np.ndarray
    gpu_healthy: np.ndarray
    gpu_mig_mode: np.ndarray
    share_free: np.ndarray
    full_free_count: np.ndarray
    max_share_free: np.ndarray
    share_free_total: np.ndarray
    allocations: Allocations
    # the snapshot this one was made from by an update (held weakly: no chain of old snapshots is kept
    # alive) and the nodes the update touched (a superset of those whose free capacity changed), or None
    lineage: tuple[weakref.ref[ClusterSnapshot], np.ndarray] | None = None

    def touched_since(self, other: ClusterSnapshot, hops: int = 4) -> np.ndarray | None:
        """The nodes touched by the updates that led from ``other`` to this snapshot (ascending; a
        superset of those whose free capacity differs), or None where the lineage does not reach
        ``other`` within ``hops`` updates (a snapshot built or rebuilt anew, or one whose parent is gone)."""
        parts, current = [], self
        for _ in range(hops):
            if current.lineage is None:
                return None
            parent, rows = current.lineage[0](), current.lineage[1]
            if parent is None:
                return None
            parts.append(rows)
            if parent is other:
                return parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts))
            current = parent
        return None

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.layout.nodes

    def node_index(self, node_id: NodeId) -> int:
        try:
            return self.layout.index_of[node_id]
        except KeyError:
            raise PlacementError(f"unknown node {node_id}") from None

    @property
    def gpu_milli_capacity(self) -> int:
        return int(self.layout.gpu_count.sum()) * MILLI_PER_GPU

    @property
    def gpu_milli_allocated(self) -> int:
        """GPU milli granted to whole and shared requests (MIG slices count by memory share)."""
        present = self.layout.gpu_present
        used = np.where(present, MILLI_PER_GPU - self.gpu_milli_free, 0).sum()
        slices = int(np.unpackbits(self.mig_used[present]).sum())
        return int(used) + slices * MILLI_PER_GPU // 8


def _derive_rows(layout: ClusterLayout, milli_free, healthy, mig_mode, rows=None) -> tuple[np.ndarray, ...]:
    """``share_free`` and its per-node summaries, for ``rows`` (all when None)."""
    sel = slice(None) if rows is None else rows
    usable = layout.gpu_present[sel] & healthy[sel] & ~mig_mode[sel]
    share = np.where(usable, milli_free[sel], 0).astype(np.int32)
    full = (share == MILLI_PER_GPU).sum(axis=1).astype(np.int32)
    return share, full, share.max(axis=1), share.sum(axis=1)


_FEW_ROWS = 4  # rows an update touches up to which their summaries are worked out in plain Python


def _derive_few(layout: ClusterLayout, milli_free, healthy, mig_mode, rows, derived) -> None:
    """``_derive_rows`` for an update's node or two, written into ``derived`` (its four arrays) in plain
    Python over their GPUs: a dozen numpy calls cost more than the arithmetic."""
    share_free, full, top, total = derived
    for row in rows.tolist():
        share = [m if p and h and not g else 0 for m, p, h, g in zip(
            milli_free[row].tolist(), layout.gpu_present[row].tolist(), healthy[row].tolist(),
            mig_mode[row].tolist())]  # fmt: skip
        share_free[row] = share
        full[row] = sum(1 for m in share if m == MILLI_PER_GPU)
        top[row] = max(share, default=0)
        total[row] = sum(share)


def _assemble(layout, cpu, memory, milli, gmem, mig, healthy, mig_mode, allocations, derived=None, lineage=None):
    if derived is None:
        derived = _derive_rows(layout, milli, healthy, mig_mode)
    arrays = (cpu, memory, milli, gmem, mig, healthy, mig_mode, *derived)
    for array in arrays:
        readonly(array)
    return ClusterSnapshot(layout, *arrays, allocations=allocations, lineage=lineage)


def build_snapshot(nodes: Iterable[Node]) -> ClusterSnapshot:
    """An empty cluster (no allocations) of ``nodes``, in the order given."""
    layout = build_layout(nodes)
    shape = layout.gpu_present.shape
    healthy = np.zeros(shape, dtype=bool)
    mig_mode = np.zeros(shape, dtype=bool)
    for row, node in enumerate(layout.nodes):
        for gpu in node.gpus:
            healthy[row, gpu.index] = gpu.healthy
            mig_mode[row, gpu.index] = gpu.mig_enabled and layout.mig_family[row, gpu.index] >= 0
    return _assemble(
        layout,
        layout.cpu_capacity.copy(),
        layout.memory_capacity.copy(),
        np.where(layout.gpu_present, MILLI_PER_GPU, 0).astype(np.int32),
        layout.gpu_memory_mib.copy(),
        np.zeros(shape, dtype=np.uint8),
        healthy,
        mig_mode,
        Allocations(),
    )


class _Draft:
    """Writable copies of a snapshot's arrays for one update; ``freeze`` makes the new snapshot."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.layout = snapshot.layout
        self.cpu = snapshot.cpu_free.copy()
        self.memory = snapshot.memory_free.copy()
        self.milli = snapshot.gpu_milli_free.copy()
        self.gmem = snapshot.gpu_memory_free.copy()
        self.mig = snapshot.mig_used  # shared until a MIG slice is granted or released (``_grant_mig`` copies)
        self.healthy = snapshot.gpu_healthy
        self.mig_mode = snapshot.gpu_mig_mode
        self.granted: dict[RequestId, tuple[Binding, ...]] = {}
        self.released: list[RequestId] = []
        self.base = snapshot
        self.touched: set[int] = set()

    def grant(self, binding: Binding, sign: int, check: bool = True) -> None:
        """Take (sign=+1) or give back (sign=-1) one binding's resources, checking capacity (unless the
        caller checks every touched row once at the end, which for grants alone finds the same)."""
        layout = self.layout
        row = layout.index_of.get(binding.node_id)
        if row is None:
            raise PlacementError(f"unknown node {binding.node_id}")
        self.touched.add(row)
        self.cpu[row] -= sign * binding.cpu_milli
        self.memory[row] -= sign * binding.memory_mib
        for gpu in binding.gpu_indices:
            if not 0 <= gpu < layout.max_gpus or not layout.gpu_present[row, gpu]:
                raise PlacementError(f"node {binding.node_id} has no GPU {gpu}")
            if binding.mig is not None:
                self._grant_mig(row, gpu, binding, sign)
                continue
            self.milli[row, gpu] -= sign * binding.gpu_milli
            # A whole GPU takes all of its memory; a share takes what it asked for.
            whole = binding.gpu_milli == MILLI_PER_GPU
            self.gmem[row, gpu] -= sign * (layout.gpu_memory_mib[row, gpu] if whole else binding.gpu_memory_mib)
        if check:
            self._check_row(row, binding.node_id)

    def _grant_mig(self, row: int, gpu: int, binding: Binding, sign: int) -> None:
        assert binding.mig is not None
        model = self.layout.models[self.layout.gpu_model[row, gpu]]
        profile = mig_profile(model, binding.mig.profile)
        if profile is None or binding.mig.start not in profile.starts:
            raise PlacementError(f"{binding.mig} is not a valid MIG placement on {model}")
        if sign > 0 and not self.mig_mode[row, gpu]:
            raise PlacementError(f"GPU {binding.node_id}/{gpu} is not in MIG mode")
        mask = profile.mask_at(binding.mig.start)
        if self.mig is self.base.mig_used:
            self.mig = self.mig.copy()
        used = int(self.mig[row, gpu])
        if sign > 0 and used & mask:
            raise PlacementError(f"MIG slices {binding.mig} on {binding.node_id}/{gpu} already used")
        if sign < 0 and used & mask != mask:
            raise PlacementError(f"MIG slices {binding.mig} on {binding.node_id}/{gpu} not allocated")
        self.mig[row, gpu] = used | mask if sign > 0 else used & ~mask & FULL_MIG_MASK

    def _check_row(self, row: int, node_id: NodeId) -> None:
        layout = self.layout
        cpu, memory = int(self.cpu[row]), int(self.memory[row])
        if cpu < 0 or memory < 0:
            raise PlacementError(f"node {node_id}: CPU or memory over capacity")
        if cpu > layout.cpu_capacity[row] or memory > layout.memory_capacity[row]:
            raise PlacementError(f"node {node_id}: released more CPU or memory than allocated")
        milli, gmem = self.milli[row].tolist(), self.gmem[row].tolist()  # a node's GPUs: plain Python
        if min(milli, default=0) < 0 or min(gmem, default=0) < 0:
            raise PlacementError(f"node {node_id}: GPU milli or GPU memory over capacity")
        if max(milli, default=0) > MILLI_PER_GPU or any(g > c for g, c in zip(gmem, layout.gpu_memory_mib[row].tolist())):
            raise PlacementError(f"node {node_id}: released more GPU than allocated")

    def freeze(self) -> ClusterSnapshot:
        # Only the touched rows change: copy the summaries and recompute those rows.
        base = self.base
        derived = tuple(
            a.copy() for a in (base.share_free, base.full_free_count, base.max_share_free, base.share_free_total)
        )
        rows = np.array(sorted(self.touched), dtype=np.int64)
        if 0 < rows.size <= _FEW_ROWS:
            _derive_few(self.layout, self.milli, self.healthy, self.mig_mode, rows, derived)
        elif rows.size:
            fresh = _derive_rows(self.layout, self.milli, self.healthy, self.mig_mode, rows)
            for target, values in zip(derived, fresh, strict=True):
                target[rows] = values
        allocations = base.allocations.evolve(self.granted, self.released) if self.granted or self.released \
            else base.allocations
        return _assemble(
            self.layout, self.cpu, self.memory, self.milli, self.gmem, self.mig,
            self.healthy, self.mig_mode, allocations, derived, (weakref.ref(base), readonly(rows)),
        )  # fmt: skip


def apply_bindings(
    snapshot: ClusterSnapshot, allocation_id: RequestId, bindings: Iterable[Binding]
) -> ClusterSnapshot:
    """Grant ``bindings`` under ``allocation_id``; raises ``PlacementError`` if anything overflows."""
    return apply_many(snapshot, ((allocation_id, bindings),))


def apply_many(
    snapshot: ClusterSnapshot, allocations: Iterable[tuple[RequestId, Iterable[Binding]]]
) -> ClusterSnapshot:
    """Grant many allocations at once (loading a cluster's state): the same checks as ``apply_bindings``
    one by one, with one copy of the arrays instead of one per allocation and each node's capacity
    checked once at the end (free capacity only falls while granting, so the end is the low point)."""
    draft = _Draft(snapshot)
    for allocation_id, bindings in allocations:
        if allocation_id in draft.granted or allocation_id in snapshot.allocations:
            raise PlacementError(f"allocation {allocation_id} already exists")
        binding_tuple = tuple(bindings)
        for binding in binding_tuple:
            if binding.mig is None and binding.gpu_milli and snapshot.gpu_mig_mode[
                snapshot.node_index(binding.node_id), list(binding.gpu_indices)
            ].any():
                raise PlacementError(f"node {binding.node_id}: whole/shared GPU request on a MIG GPU")
            draft.grant(binding, +1, check=False)
        draft.granted[allocation_id] = binding_tuple
    for row in sorted(draft.touched):
        draft._check_row(row, snapshot.layout.nodes[row].id)
    return draft.freeze()


def apply(snapshot: ClusterSnapshot, decision: Decision) -> ClusterSnapshot:
    """Grant a placed decision; the allocation id is the request id."""
    if not decision.placed:
        raise PlacementError(f"decision for {decision.request_id} placed nothing")
    return apply_bindings(snapshot, decision.request_id, decision.bindings)


def release(snapshot: ClusterSnapshot, allocation_id: RequestId) -> ClusterSnapshot:
    """Give back everything granted under ``allocation_id``."""
    bindings = snapshot.allocations.get(allocation_id)
    if bindings is None:
        raise PlacementError(f"no allocation {allocation_id}")
    draft = _Draft(snapshot)
    for binding in bindings:
        draft.grant(binding, -1)
    draft.released.append(allocation_id)
    return draft.freeze()


def with_gpu_state(
    snapshot: ClusterSnapshot,
    node_id: NodeId,
    gpu_index: int,
    *,
    healthy: bool | None = None,
    mig_enabled: bool | None = None,
) -> ClusterSnapshot:
    """Record a health or MIG-mode change of one GPU (MIG mode changes only on an idle GPU)."""
    row = snapshot.node_index(node_id)
    if not 0 <= gpu_index < snapshot.layout.max_gpus or not snapshot.layout.gpu_present[row, gpu_index]:
        raise PlacementError(f"node {node_id} has no GPU {gpu_index}")
    draft = _Draft(snapshot)
    draft.healthy = snapshot.gpu_healthy.copy()
    draft.mig_mode = snapshot.gpu_mig_mode.copy()
    draft.touched.add(row)
    if healthy is not None:
        draft.healthy[row, gpu_index] = healthy
    if mig_enabled is not None and mig_enabled != bool(snapshot.gpu_mig_mode[row, gpu_index]):
        idle = (
            snapshot.gpu_milli_free[row, gpu_index] == MILLI_PER_GPU
            and snapshot.mig_used[row, gpu_index] == 0
        )
        if not idle:
            raise PlacementError(f"GPU {node_id}/{gpu_index} is in use; MIG mode cannot change")
        if mig_enabled and snapshot.layout.mig_family[row, gpu_index] < 0:
            raise PlacementError(f"GPU {node_id}/{gpu_index} does not support MIG")
        draft.mig_mode[row, gpu_index] = mig_enabled
    return draft.freeze()


def rebuild(snapshot: ClusterSnapshot, nodes: Iterable[Node]) -> ClusterSnapshot:
    """A snapshot over a new node inventory, keeping the allocations whose nodes all remain.

    Allocations on removed nodes are dropped; callers compare ``allocations`` to requeue them.
    """
    fresh = build_snapshot(nodes)
    for allocation_id, bindings in snapshot.allocations.items():
        if all(binding.node_id in fresh.layout.index_of for binding in bindings):
            fresh = apply_bindings(fresh, allocation_id, bindings)
    return fresh
