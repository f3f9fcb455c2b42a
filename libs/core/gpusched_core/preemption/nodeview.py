"""One node at a time: a one-node snapshot holding exactly that node's allocations.

A single-node request can only use freed resources on the node it lands on, so "does releasing these
victims let the request run on node n" is asked of a one-node snapshot (cheap to copy) through the
placement engine's own feasibility check: the same capacity, model, health, MIG-mode and MIG
slice-position rules as a real placement. ``fits_after`` answers it; ``could_fit`` is a cheap
necessary condition (enough CPU, memory, GPU milli and MIG slices in total) that prunes the search.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from gpusched_core.placement import (
    MIG_FAMILIES,
    MILLI_PER_GPU,
    Binding,
    ClusterSnapshot,
    GpuShare,
    MigSlice,
    Node,
    NodeId,
    PodRequest,
    RequestId,
    WholeGpus,
    apply_bindings,
    build_snapshot,
    feasible_mask,
    release,
)

Allocations = Mapping[str, tuple[Binding, ...]]
HELD = "\x00held"  # the block of a view's allocations that no search releases


def released(snapshot: ClusterSnapshot, allocation_ids: Iterable[str]) -> ClusterSnapshot:
    """A copy of ``snapshot`` without ``allocation_ids`` (ids it does not hold are skipped)."""
    for allocation_id in dict.fromkeys(allocation_ids):
        if allocation_id in snapshot.allocations:
            snapshot = release(snapshot, RequestId(allocation_id))
    return snapshot


def allocations_by_node(snapshot: ClusterSnapshot) -> dict[NodeId, dict[str, tuple[Binding, ...]]]:
    """Each node's allocations: allocation id -> the bindings of that allocation on the node."""
    by_node: dict[NodeId, dict[str, list[Binding]]] = {}
    for allocation_id, bindings in snapshot.allocations.items():
        for binding in bindings:
            by_node.setdefault(binding.node_id, {}).setdefault(allocation_id, []).append(binding)
    return {node: {a: tuple(b) for a, b in allocs.items()} for node, allocs in by_node.items()}


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a set of allocations holds on one node, summed (for the cheap necessary condition)."""

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_milli: int = 0
    mig_slices: int = 0

    def __add__(self, other: Footprint) -> Footprint:
        return Footprint(self.cpu_milli + other.cpu_milli, self.memory_mib + other.memory_mib,
                         self.gpu_milli + other.gpu_milli, self.mig_slices + other.mig_slices)  # fmt: skip


def footprint(bindings: Iterable[Binding]) -> Footprint:
    total = Footprint()
    for binding in bindings:
        mig = 0 if binding.mig is None else _profile_slices(binding.mig.profile) * len(binding.gpu_indices)
        gpu = 0 if binding.mig is not None else binding.gpu_milli * len(binding.gpu_indices)
        total = total + Footprint(binding.cpu_milli, binding.memory_mib, gpu, mig)
    return total


def _profile_slices(profile: str) -> int:
    # Every MIG family shares the geometry of a profile name's size; the first that has it decides.
    for family in MIG_FAMILIES.values():
        if profile in family:
            return family[profile].memory_slices
    return 0


def free_on_node(snapshot: ClusterSnapshot, row: int) -> Footprint:
    """What is free on node ``row`` of the full snapshot, in ``Footprint`` terms."""
    usable = snapshot.gpu_mig_mode[row] & snapshot.gpu_healthy[row]
    mig_free = int(np.where(usable, 8 - _popcount(snapshot.mig_used[row]), 0).sum())
    return Footprint(int(snapshot.cpu_free[row]), int(snapshot.memory_free[row]), int(snapshot.share_free_total[row]),
                     mig_free)  # fmt: skip


def could_fit(request: PodRequest, free: Footprint) -> bool:
    """Necessary (not sufficient) condition: enough of every resource in total."""
    need = _need(request)
    return (free.cpu_milli >= need.cpu_milli and free.memory_mib >= need.memory_mib
            and free.gpu_milli >= need.gpu_milli and free.mig_slices >= need.mig_slices)  # fmt: skip


def _need(request: PodRequest) -> Footprint:
    gpu = request.gpu
    milli = gpu.count * MILLI_PER_GPU if isinstance(gpu, WholeGpus) else gpu.milli if isinstance(gpu, GpuShare) else 0
    slices = _profile_slices(gpu.profile) if isinstance(gpu, MigSlice) else 0
    return Footprint(request.cpu_milli, request.memory_mib, milli, slices)


class NodeView:
    """The node at ``row`` of ``snapshot`` as a one-node snapshot with its allocations."""

    def __init__(self, snapshot: ClusterSnapshot, row: int, allocations: Allocations,
                 releasable: Iterable[str] = ()) -> None:  # fmt: skip
        """``releasable``: the allocations a search may release; the others are held as one block."""
        node = snapshot.layout.nodes[row]
        gpus = tuple(replace(gpu, healthy=bool(snapshot.gpu_healthy[row, gpu.index]),
                             mig_enabled=bool(snapshot.gpu_mig_mode[row, gpu.index])) for gpu in node.gpus)  # fmt: skip
        view = build_snapshot([Node(node.id, node.cpu_milli, node.memory_mib, gpus, node.labels)])
        movable = set(releasable) & set(allocations)
        held = [b for a in sorted(allocations) if a not in movable for b in allocations[a]]
        if held:
            view = apply_bindings(view, RequestId(HELD), held)
        for allocation_id in sorted(movable):
            view = apply_bindings(view, RequestId(allocation_id), allocations[allocation_id])
        self.row = row
        self.node_id = node.id
        self.snapshot = view
        self.allocations = allocations
        mig_free = np.where(view.gpu_mig_mode & view.gpu_healthy, 8 - _popcount(view.mig_used), 0)
        self.free = Footprint(int(view.cpu_free[0]), int(view.memory_free[0]), int(view.share_free_total[0]),
                              int(mig_free.sum()))  # fmt: skip
        self.fit_checks = 0
        self.capped = False  # set when a search of this node hit a cap (its option is then not proven minimal)

    def footprint_of(self, allocation_ids: Iterable[str]) -> Footprint:
        total = Footprint()
        for allocation_id in allocation_ids:
            total = total + footprint(self.allocations.get(allocation_id, ()))
        return total

    def could_fit(self, request: PodRequest, freed: Footprint) -> bool:
        """Necessary (not sufficient) condition: enough of every resource in total once ``freed``."""
        return could_fit(request, self.free + freed)

    def fits_after(self, request: PodRequest, allocation_ids: Iterable[str]) -> bool:
        """Whether ``request`` fits on this node once ``allocation_ids`` are released (engine check)."""
        self.fit_checks += 1
        view = self.snapshot
        for allocation_id in allocation_ids:
            if allocation_id in view.allocations:
                view = release(view, RequestId(allocation_id))
        return bool(feasible_mask(view, request)[0])


def _popcount(values: np.ndarray) -> np.ndarray:
    return np.unpackbits(values.astype(np.uint8)[..., None], axis=-1).sum(axis=-1)
