"""Test builders: ``a_node("n1").gpus(8)``, ``a_request("r1").share(500)``, ``a_cluster(...)``."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpusched_core.placement import (
    DEFAULT_TOPOLOGY_KEY,
    ClusterSnapshot,
    GangRequest,
    Gpu,
    GpuAsk,
    GpuShare,
    MigSlice,
    Node,
    NodeId,
    PodRequest,
    RequestId,
    WholeGpus,
    build_snapshot,
)


@dataclass
class NodeBuilder:
    node_id: str
    cpu_milli: int = 64_000
    memory_mib: int = 256 * 1024
    gpu_models: list[str] = field(default_factory=list)
    gpu_memory_mib: int = 16_000
    nvlink: list[int | None] = field(default_factory=list)
    mig_gpus: set[int] = field(default_factory=set)
    unhealthy_gpus: set[int] = field(default_factory=set)
    labels: dict[str, str] = field(default_factory=dict)

    def gpus(self, count: int, model: str = "A10", memory_mib: int | None = None) -> NodeBuilder:
        self.gpu_models = [model] * count
        self.nvlink = [None] * count
        if memory_mib is not None:
            self.gpu_memory_mib = memory_mib
        return self

    def cpu(self, milli: int) -> NodeBuilder:
        self.cpu_milli = milli
        return self

    def memory(self, mib: int) -> NodeBuilder:
        self.memory_mib = mib
        return self

    def nvlink_domains(self, *domains: int | None) -> NodeBuilder:
        self.nvlink = list(domains)
        return self

    def mig(self, *indices: int) -> NodeBuilder:
        self.mig_gpus = set(indices) if indices else set(range(len(self.gpu_models)))
        return self

    def unhealthy(self, *indices: int) -> NodeBuilder:
        self.unhealthy_gpus = set(indices)
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self.labels[key] = value
        return self

    def block(self, value: str) -> NodeBuilder:
        return self.label(DEFAULT_TOPOLOGY_KEY, value)

    def build(self) -> Node:
        gpus = tuple(
            Gpu(index=i, model=model, memory_mib=self.gpu_memory_mib, uuid=f"GPU-{self.node_id}-{i}",
                healthy=i not in self.unhealthy_gpus, nvlink_domain=self.nvlink[i], mig_enabled=i in self.mig_gpus)
            for i, model in enumerate(self.gpu_models)
        )  # fmt: skip
        return Node(NodeId(self.node_id), self.cpu_milli, self.memory_mib, gpus, self.labels)


def a_node(node_id: str) -> NodeBuilder:
    return NodeBuilder(node_id)


@dataclass
class RequestBuilder:
    request_id: str
    gpu_ask: GpuAsk = None
    cpu_milli: int = 0
    memory_mib: int = 0
    models: frozenset[str] = frozenset()
    selector: dict[str, str] = field(default_factory=dict)

    def whole(self, count: int) -> RequestBuilder:
        self.gpu_ask = WholeGpus(count)
        return self

    def share(self, milli: int, memory_mib: int = 0) -> RequestBuilder:
        self.gpu_ask = GpuShare(milli, memory_mib)
        return self

    def mig(self, profile: str) -> RequestBuilder:
        self.gpu_ask = MigSlice(profile)
        return self

    def cpu(self, milli: int) -> RequestBuilder:
        self.cpu_milli = milli
        return self

    def memory(self, mib: int) -> RequestBuilder:
        self.memory_mib = mib
        return self

    def of_models(self, *models: str) -> RequestBuilder:
        self.models = frozenset(models)
        return self

    def on(self, key: str, value: str) -> RequestBuilder:
        self.selector[key] = value
        return self

    def build(self) -> PodRequest:
        return PodRequest(RequestId(self.request_id), self.gpu_ask, self.cpu_milli, self.memory_mib, self.models,
                          tuple(self.selector.items()))  # fmt: skip


def a_request(request_id: str) -> RequestBuilder:
    return RequestBuilder(request_id)


def a_gang(gang_id: str, nodes: int, gpus_per_node: int, **kwargs: object) -> GangRequest:
    return GangRequest(RequestId(gang_id), nodes, gpus_per_node, **kwargs)  # type: ignore[arg-type]


def a_cluster(*nodes: NodeBuilder | Node) -> ClusterSnapshot:
    return build_snapshot(n.build() if isinstance(n, NodeBuilder) else n for n in nodes)
