"""The simulated cluster: whole-GPU nodes placed by the placement engine (``gpusched_core.placement``).

The engine chooses the node(s) and GPUs under a named policy (default ``bestfit``) on an immutable
snapshot; this class keeps the current snapshot plus a free-GPU count per node, so a job that cannot
fit anywhere is refused without asking the engine. A job of more GPUs than one node has is a gang of
``k`` equal members on distinct nodes (``gang_shape``), all or nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpusched_core import placement as engine
from gpusched_core.whatif.cluster import gang_shape


FLAVOR = "philly-gpu"
DEFAULT_PLACEMENT = "bestfit"


@dataclass(frozen=True, slots=True)
class Binding:
    node: int  # row of the node in the snapshot
    gpu_indices: tuple[int, ...]


def gang_parts(gpus: int, per_node: int) -> tuple[int, ...]:
    members, each = gang_shape(gpus, per_node)
    return (each,) * members


def placement_request(job_id: str, gpus: int, per_node: int) -> engine.PodRequest | engine.GangRequest:
    """What the placement engine is asked for a job of ``gpus`` (a gang when it needs several nodes)."""
    members, each = gang_shape(gpus, per_node)
    if members == 1:
        return engine.PodRequest(id=engine.RequestId(job_id), gpu=engine.WholeGpus(gpus))
    return engine.GangRequest(id=engine.RequestId(job_id), node_count=members, gpus_per_node=each)


class Cluster:
    """Mutable for speed, but only through ``place`` and ``release``; the engine's snapshot refuses to
    grant any GPU twice (``apply`` checks capacity)."""

    def __init__(self, nodes: int, gpus_per_node: int, model: str = FLAVOR, placement: str = DEFAULT_PLACEMENT) -> None:
        self.gpus_per_node = gpus_per_node
        self.capacity = nodes * gpus_per_node
        self.policy = engine.make_policy(placement)
        self.snapshot = engine.build_snapshot(
            engine.Node(engine.NodeId(f"node-{i:04d}"), 64_000, 512 * 1024,
                        tuple(engine.Gpu(g, model, 80 * 1024, f"gpu-{i}-{g}") for g in range(gpus_per_node)))
            for i in range(nodes))
        self.row = {f"node-{i:04d}": i for i in range(nodes)}
        self.free = [gpus_per_node] * nodes
        self.free_total = self.capacity

    def can_place(self, gpus: int) -> bool:
        if gpus > self.free_total:
            return False
        members, each = gang_shape(gpus, self.gpus_per_node)
        if members == 1:
            return max(self.free) >= gpus
        return sum(1 for f in self.free if f >= each) >= members

    def place(self, job_id: str, gpus: int) -> tuple[Binding, ...] | None:
        """Bind the job's GPUs, or return None and change nothing."""
        if not self.can_place(gpus):
            return None
        request = placement_request(job_id, gpus, self.gpus_per_node)
        decision = engine.place(self.snapshot, request, self.policy, tie_break_seed=0)
        if not decision.placed:
            return None
        self.snapshot = engine.apply(self.snapshot, decision)
        bindings = tuple(Binding(self.row[b.node_id], tuple(b.gpu_indices)) for b in decision.bindings)
        for binding in bindings:
            self.free[binding.node] -= len(binding.gpu_indices)
            self.free_total -= len(binding.gpu_indices)
        return bindings

    def release(self, job_id: str, bindings: tuple[Binding, ...]) -> None:
        self.snapshot = engine.release(self.snapshot, engine.RequestId(job_id))
        for binding in bindings:
            self.free[binding.node] += len(binding.gpu_indices)
            self.free_total += len(binding.gpu_indices)
