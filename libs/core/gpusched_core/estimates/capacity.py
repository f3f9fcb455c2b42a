"""Free GPUs as the forward simulation keeps them: per node, each healthy GPU's free milli. A job is
fitted best-fit (the live default policy): whole GPUs on the node with the fewest free whole GPUs that
suffice, a gang on the ``nodes`` such nodes, a share or MIG slice on the GPU with the least free milli that
suffices. An estimate, not placement: host CPU, memory, MIG geometry and node selectors are not checked."""

from __future__ import annotations

from collections.abc import Iterable

from gpusched_core.placement.model import MILLI_PER_GPU

from .model import Hold, NodeGpus, Shape


class FreeGpus:
    """Mutable working copy; built from immutable values, never written back."""

    def __init__(self, nodes: Iterable[NodeGpus]) -> None:
        self.free: dict[str, dict[int, int]] = {}
        self.by_model: dict[str, list[str]] = {}
        for node in sorted(nodes, key=lambda n: n.node_id):
            self.free[node.node_id] = {i: MILLI_PER_GPU for i in node.gpu_indices}
            self.by_model.setdefault(node.model, []).append(node.node_id)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self.by_model))

    def take(self, holds: Iterable[Hold]) -> None:
        for hold in holds:
            gpus = self.free.get(hold.node_id)
            if gpus is not None and hold.gpu_index in gpus:
                gpus[hold.gpu_index] = max(0, gpus[hold.gpu_index] - hold.milli)

    def give(self, holds: Iterable[Hold]) -> None:
        for hold in holds:
            gpus = self.free.get(hold.node_id)
            if gpus is not None and hold.gpu_index in gpus:
                gpus[hold.gpu_index] = min(MILLI_PER_GPU, gpus[hold.gpu_index] + hold.milli)

    def could_ever_fit(self, shape: Shape, model: str) -> bool:
        """Whether the job fits this model's nodes with nothing running."""
        nodes = self.by_model.get(model, [])
        if shape.fraction_milli is not None:
            return bool(nodes) and any(self.free[n] for n in nodes)
        return sum(1 for n in nodes if len(self.free[n]) >= shape.gpus) >= shape.nodes

    def fit(self, shape: Shape, model: str) -> tuple[Hold, ...] | None:
        """The GPUs the job would take now (None: no room)."""
        nodes = self.by_model.get(model, [])
        fraction = shape.fraction_milli
        if fraction is not None:
            best = min(((m, n, i) for n in nodes for i, m in self.free[n].items() if m >= fraction), default=None)
            return None if best is None else (Hold(best[1], best[2], fraction),)
        whole = []
        for node_id in nodes:
            idle = [i for i, m in sorted(self.free[node_id].items()) if m >= MILLI_PER_GPU]
            if len(idle) >= shape.gpus:
                whole.append((len(idle), node_id, idle[:shape.gpus]))
        if len(whole) < shape.nodes:
            return None
        whole.sort()
        return tuple(Hold(node_id, i) for _, node_id, idle in whole[:shape.nodes] for i in idle)
