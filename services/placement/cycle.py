"""One placement cycle on the placement engine (pure): database rows in, placements and deferrals out.

The live service rebuilds the engine's snapshot from PostgreSQL once per cycle (not per job), places the
pending jobs in order on it under the configured policy, and applies each placement to the snapshot
before the next job, so a cycle never hands out a GPU twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from services.placement import engine
from services.placement.core import Deferral, PendingJob, Placement, order_pending


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuRow, ...]
    labels: Mapping[str, str]


def nomination_id(job_id: str) -> str:
    return f"nominated-for/{job_id}"


def build_cluster(nodes: list[NodeRow], allocations: Mapping[str, list[tuple[str, int]]],
                  nominations: Mapping[str, list[tuple[str, int]]]) -> engine.ClusterSnapshot:
    """The engine snapshot: nodes with their GPUs, every job's allocation, and the GPUs held for a
    preemptor (an allocation of their own, released only for that preemptor)."""
    snapshot = engine.build_snapshot(
        engine.Node(
            id=engine.NodeId(n.node_id), cpu_milli=n.cpu_milli, memory_mib=n.memory_mib, labels=dict(n.labels),
            gpus=tuple(engine.Gpu(g.index, g.model, g.memory_mib, g.uuid, g.healthy) for g in n.gpus),
        ) for n in sorted(nodes, key=lambda n: n.node_id))
    for allocation_id, gpus in [*sorted(allocations.items()),
                                *((nomination_id(j), g) for j, g in sorted(nominations.items()))]:
        snapshot = engine.apply_bindings(snapshot, engine.RequestId(allocation_id), _whole_gpus(gpus))
    return snapshot


def _whole_gpus(gpus: list[tuple[str, int]]) -> list[engine.Binding]:
    by_node: dict[str, list[int]] = {}
    for node_id, index in gpus:
        by_node.setdefault(node_id, []).append(index)
    return [engine.Binding(engine.NodeId(node), tuple(sorted(indices)), gpu_milli=engine.MILLI_PER_GPU)
            for node, indices in sorted(by_node.items())]


def request_for(job: PendingJob) -> engine.PodRequest:
    return engine.PodRequest(id=engine.RequestId(job.job_id), gpu=engine.WholeGpus(job.gpus),
                             allowed_models=frozenset({job.gpu_model}) if job.gpu_model else frozenset())


def plan_cycle(snapshot: engine.ClusterSnapshot, pending: list[PendingJob], policy: engine.PlacementPolicy,
               nodes: list[NodeRow]) -> tuple[list[Placement], list[Deferral]]:
    """Place pending jobs in order (priority, arrival, id); one that does not fit does not stop smaller
    ones behind it. GPUs nominated for a job are offered to that job only."""
    uuids = {(n.node_id, g.index): g.uuid for n in nodes for g in n.gpus}
    models = {(n.node_id, g.index): g.model for n in nodes for g in n.gpus}
    placements: list[Placement] = []
    deferrals: list[Deferral] = []
    for job in order_pending(pending):
        held = engine.RequestId(nomination_id(job.job_id))
        view = engine.release(snapshot, held) if held in snapshot.allocations else snapshot
        decision = engine.place(view, request_for(job), policy)
        if not decision.placed:
            reasons = tuple(str(r) for r in decision.unplaced_by_class) or decision.reasons
            deferrals.append(Deferral(job.job_id, reasons))
            continue
        snapshot = engine.apply(view, decision)
        binding = decision.bindings[0]
        node = str(binding.node_id)
        placements.append(Placement(
            job.job_id, node, tuple(binding.gpu_indices), tuple(uuids[(node, i)] for i in binding.gpu_indices),
            models[(node, binding.gpu_indices[0])], "; ".join(decision.reasons)))
    return placements, deferrals
