"""The replayed cluster: today's nodes (any mix of GPU models and sizes) placed by the placement engine under
a named policy (``gpusched_core.placement.make_policy``). A job of more GPUs than a node of its model has is a
gang of equal members (``gang_shape``, as the queue simulator splits one), all or nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpusched_core import placement as engine


def gang_shape(gpus: int, per_node: int) -> tuple[int, int]:
    """``(members, gpus per member)``: the fewest equal members of at most ``per_node`` GPUs.
    ``12`` on 8-GPU nodes -> ``(2, 6)``; ``32`` -> ``(4, 8)``; ``3`` -> ``(1, 3)``."""
    members = -(-gpus // per_node)
    while gpus % members:
        members += 1
    return members, gpus // members


@dataclass(frozen=True, slots=True)
class ReplayNode:
    node_id: str
    model: str
    gpus: int


class ReplayCluster:
    """Mutable only through ``place`` and ``release``; the engine's snapshot refuses to grant a GPU twice."""

    def __init__(self, nodes: Sequence[ReplayNode], placement: str = "bestfit",
                 workload: engine.WorkloadDistribution | None = None) -> None:
        self.policy = engine.make_policy(placement, workload=workload)
        self.snapshot = engine.build_snapshot(
            engine.Node(engine.NodeId(n.node_id), 1_000_000, 64 * 1024 * 1024,
                        tuple(engine.Gpu(g, n.model, 80 * 1024, f"{n.node_id}-{g}") for g in range(n.gpus)),
                        {engine.MODEL_LABEL: n.model})
            for n in nodes)
        self.capacity = sum(n.gpus for n in nodes)
        self.per_node = {m: max(n.gpus for n in nodes if n.model == m) for m in {n.model for n in nodes}}
        self.free_by_model = {m: sum(n.gpus for n in nodes if n.model == m) for m in self.per_node}
        self.sizes = {m: [n.gpus for n in nodes if n.model == m] for m in self.per_node}
        self.allocated = 0
        self._held: dict[str, tuple[str, int]] = {}  # job -> (model, GPUs)
        self.bindings: dict[str, tuple[engine.Binding, ...]] = {}

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self.per_node))

    def request(self, job_id: str, gpus: int, model: str) -> engine.PodRequest | engine.GangRequest:
        members, each = gang_shape(gpus, self.per_node[model])
        if members == 1:
            return engine.PodRequest(id=engine.RequestId(job_id), gpu=engine.WholeGpus(gpus),
                                     allowed_models=frozenset({model}))
        return engine.GangRequest(id=engine.RequestId(job_id), node_count=members, gpus_per_node=each,
                                  allowed_models=frozenset({model}))

    def could_ever_fit(self, gpus: int, models: Iterable[str]) -> bool:
        """Whether an empty cluster could hold it on one of ``models`` (a gang: on enough nodes)."""
        for model in models:
            if model not in self.per_node:
                continue
            members, each = gang_shape(gpus, self.per_node[model])
            if sum(1 for size in self.sizes[model] if size >= each) >= members:
                return True
        return False

    def place(self, job_id: str, gpus: int, model: str) -> bool:
        """Bind the job's GPUs on ``model`` nodes, or change nothing and say no."""
        if self.free_by_model.get(model, 0) < gpus:
            return False
        decision = engine.place(self.snapshot, self.request(job_id, gpus, model), self.policy, tie_break_seed=0)
        if not decision.placed:
            return False
        self.bind(job_id, gpus, model, decision)
        return True

    def bind(self, job_id: str, gpus: int, model: str, decision: engine.Decision) -> None:
        """Hold what ``decision`` places (a preemption plan's slot, verified by the preemption core)."""
        self.snapshot = engine.apply(self.snapshot, decision)
        self.bindings[job_id] = tuple(decision.bindings)
        self._held[job_id] = (model, gpus)
        self.free_by_model[model] -= gpus
        self.allocated += gpus

    def holds(self, job_id: str) -> tuple[str, int] | None:
        """``(model, GPUs)`` the job holds, or None."""
        return self._held.get(job_id)

    def release(self, job_id: str) -> None:
        model, gpus = self._held.pop(job_id)
        self.bindings.pop(job_id, None)
        self.snapshot = engine.release(self.snapshot, engine.RequestId(job_id))
        self.free_by_model[model] += gpus
        self.allocated -= gpus

    def fragmentation_pct(self, workload: engine.WorkloadDistribution) -> float:
        return engine.cluster_fragmentation(self.snapshot, workload).fragmentation_pct
