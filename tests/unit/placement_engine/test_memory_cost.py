"""``ours`` counts the GPU a node's memory can no longer serve: memory taken faster than the workload asks
it per GPU strands the node's free GPUs (FGD's measure, and our CPU-capped one, leave memory out)."""

from __future__ import annotations

import pytest

from gpusched_core.placement import (
    MILLI_PER_GPU,
    RequestShape,
    WorkloadDistribution,
    make_policy,
    place,
    workload_from_requests,
)

from .builders import a_cluster, a_node, a_request

RATIO = 40.0  # MiB per GPU milli: 40 GiB-ish per GPU
ONE_GPU = RequestShape(4_000, MILLI_PER_GPU, 1)
WORKLOAD = WorkloadDistribution((ONE_GPU,), (1.0,), memory_per_milli=RATIO)


def test_the_workload_knows_the_memory_its_gpu_requests_ask_per_gpu_milli() -> None:
    requests = [
        a_request("a").whole(2).cpu(4_000).memory(60_000).build(),
        a_request("b").share(500).cpu(2_000).memory(10_000).build(),
        a_request("cpu-only").cpu(8_000).memory(500_000).build(),  # no GPU: not counted
    ]
    workload = workload_from_requests(requests)
    assert workload.memory_per_milli == pytest.approx(70_000 / 2_500)
    assert workload.most_popular(0.5).memory_per_milli == workload.memory_per_milli
    assert workload_from_requests([a_request("m").whole(1).build()]).memory_per_milli is None


def test_a_workload_ratio_must_be_positive() -> None:
    with pytest.raises(ValueError, match="memory_per_milli"):
        WorkloadDistribution((ONE_GPU,), (1.0,), memory_per_milli=0.0)


def _two_nodes_alike_but_for_free_memory():  # noqa: ANN202
    """Two nodes of 4 GPUs and the same CPU: the first has memory for 2 GPUs' worth of typical pods,
    the second for 8."""
    return a_cluster(a_node("tight").gpus(4).cpu(64_000).memory(int(2 * MILLI_PER_GPU * RATIO)),
                     a_node("roomy").gpus(4).cpu(64_000).memory(int(8 * MILLI_PER_GPU * RATIO)))  # fmt: skip


def test_a_memory_hungry_pod_goes_where_memory_does_not_run_out_before_the_gpus() -> None:
    snapshot = _two_nodes_alike_but_for_free_memory()
    hungry = a_request("hungry").whole(1).cpu(4_000).memory(int(1.5 * MILLI_PER_GPU * RATIO)).build()
    assert place(snapshot, hungry, make_policy("ours", workload=WORKLOAD)).bindings[0].node_id == "roomy"
    # FGD does not see memory: the nodes tie and node order decides.
    assert place(snapshot, hungry, make_policy("fgd", workload=WORKLOAD)).bindings[0].node_id == "tight"


def test_a_pod_that_asks_memory_in_the_workloads_proportion_decides_as_before() -> None:
    snapshot = _two_nodes_alike_but_for_free_memory()
    typical = a_request("typical").whole(1).cpu(4_000).memory(int(MILLI_PER_GPU * RATIO)).build()
    assert place(snapshot, typical, make_policy("ours", workload=WORKLOAD)).bindings[0].node_id == "tight"


def test_without_a_known_ratio_memory_costs_nothing() -> None:
    snapshot = _two_nodes_alike_but_for_free_memory()
    hungry = a_request("hungry").whole(1).cpu(4_000).memory(int(1.5 * MILLI_PER_GPU * RATIO)).build()
    blind = WorkloadDistribution((ONE_GPU,), (1.0,))
    assert place(snapshot, hungry, make_policy("ours", workload=blind)).bindings[0].node_id == "tight"
