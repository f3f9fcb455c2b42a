"""Builders for preemption scenarios: ``a_cluster(a_node("n1").gpus(8))`` then ``.run(...)`` jobs at
explicit GPUs, so each scenario states exactly what sits where."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusched_core.placement import (
    Binding,
    ClusterSnapshot,
    GangRequest,
    Gpu,
    GpuShare,
    MigPlacement,
    MigSlice,
    Node,
    NodeId,
    PodRequest,
    RequestId,
    WholeGpus,
    apply_bindings,
    build_snapshot,
    with_gpu_state,
)
from gpusched_core.preemption import Preemptor, RunningJob


@dataclass
class NodeBuilder:
    node_id: str
    count: int = 0
    model: str = "A10"
    cpu_milli: int = 64_000
    memory_mib: int = 256 * 1024
    mig: tuple[int, ...] = ()

    def gpus(self, count: int, model: str = "A10") -> NodeBuilder:
        self.count, self.model = count, model
        return self

    def cpu(self, milli: int) -> NodeBuilder:
        self.cpu_milli = milli
        return self

    def mig_mode(self, *indices: int) -> NodeBuilder:
        self.mig = indices
        return self

    def build(self) -> Node:
        gpus = tuple(Gpu(i, self.model, 80_000 if "80" in self.model else 16_000) for i in range(self.count))
        return Node(NodeId(self.node_id), self.cpu_milli, self.memory_mib, gpus)


def a_node(node_id: str) -> NodeBuilder:
    return NodeBuilder(node_id)


@dataclass
class ClusterBuilder:
    snapshot: ClusterSnapshot
    jobs: list[RunningJob] = field(default_factory=list)

    def run(self, job_id: str, node: str, gpus: tuple[int, ...] = (), *, milli: int = 1000, cpu: int = 0,
            mig: tuple[str, int] | None = None, priority: int = 0, tenant: str = "t", started: float = 0.0,
            checkpoint: float | None = None, units: int | None = None, klass: str = "batch",
            preempting: bool = False, preempted_for: str | None = None) -> ClusterBuilder:  # fmt: skip
        """A job on ``node``: whole GPUs (milli 1000), a share (milli < 1000) or a MIG slice. Its flavor is
        the model of the node's GPUs."""
        placement = None if mig is None else MigPlacement(mig[0], mig[1])
        binding = Binding(NodeId(node), gpus, 0 if mig else milli, 0, placement, cpu, 0)
        self.snapshot = apply_bindings(self.snapshot, RequestId(job_id), (binding,))
        held = units if units is not None else (len(gpus) * milli if not mig else 1000)
        flavor = self.snapshot.nodes[self.snapshot.node_index(node)].gpus[0].model
        self.jobs.append(RunningJob(job_id, tenant, priority, started, (job_id,), klass, held, checkpoint, preempting,
                                    flavor, preempted_for))
        return self

    def gang(self, job_id: str, members: list[tuple[str, tuple[int, ...]]], *, priority: int = 0,
             tenant: str = "t", started: float = 0.0) -> ClusterBuilder:  # fmt: skip
        """A gang whose members are separate allocations ``<job>/<i>``; preempted as one job."""
        ids = []
        for ordinal, (node, gpus) in enumerate(members):
            member_id = f"{job_id}/{ordinal}"
            self.snapshot = apply_bindings(self.snapshot, RequestId(member_id), (Binding(NodeId(node), gpus, 1000),))
            ids.append(member_id)
        units = sum(len(g) for _, g in members) * 1000
        self.jobs.append(RunningJob(job_id, tenant, priority, started, tuple(ids), "batch", units))
        return self


def a_cluster(*nodes: NodeBuilder) -> ClusterBuilder:
    built = [node.build() for node in nodes]
    snapshot = build_snapshot(built)
    for node in nodes:
        for index in node.mig:
            snapshot = with_gpu_state(snapshot, NodeId(node.node_id), index, mig_enabled=True)
    return ClusterBuilder(snapshot)


def whole(job_id: str, count: int, *, priority: int = 100, tenant: str = "t",
          models: tuple[str, ...] = ()) -> Preemptor:  # fmt: skip
    request = PodRequest(RequestId(job_id), WholeGpus(count), allowed_models=frozenset(models))
    return Preemptor(job_id, tenant, priority, request, count * 1000)


def share(job_id: str, milli: int, *, priority: int = 100, tenant: str = "t") -> Preemptor:
    return Preemptor(job_id, tenant, priority, PodRequest(RequestId(job_id), GpuShare(milli)), milli)


def mig_slice(job_id: str, profile: str, *, priority: int = 100, tenant: str = "t") -> Preemptor:
    return Preemptor(job_id, tenant, priority, PodRequest(RequestId(job_id), MigSlice(profile)), 1000)


def gang(job_id: str, nodes: int, gpus: int, *, priority: int = 100, tenant: str = "t") -> Preemptor:
    return Preemptor(job_id, tenant, priority, GangRequest(RequestId(job_id), nodes, gpus), nodes * gpus * 1000)
