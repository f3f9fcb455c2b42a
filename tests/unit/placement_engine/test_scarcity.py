"""``ours`` leaves GPU models that pinned demand needs to the pods pinned to them."""

from __future__ import annotations

import numpy as np
import pytest

from gpusched_core.placement import MILLI_PER_GPU, RequestShape, WorkloadDistribution, make_policy, place
from gpusched_core.placement.scarcity import ModelIndex, model_pressure, scarcity_cost

from .builders import a_cluster, a_node, a_request

FREE = RequestShape(4_000, MILLI_PER_GPU, 1)
ON_T4 = RequestShape(4_000, MILLI_PER_GPU, 1, frozenset({"T4"}))


def a_t4_and_an_a10_node():  # noqa: ANN201
    return a_cluster(a_node("a10").gpus(4, "A10"), a_node("t4").gpus(4, "T4"))


def test_pressure_is_the_share_of_a_model_its_pinned_demand_needs() -> None:
    snapshot = a_t4_and_an_a10_node()
    workload = WorkloadDistribution((FREE, ON_T4), (0.5, 0.5))
    pressure = dict(zip(snapshot.layout.models, model_pressure(workload, snapshot.layout), strict=True))
    assert pressure == {"A10": 0.0, "T4": pytest.approx(1.0)}  # half the demand, half the GPUs


def test_nothing_pinned_means_no_pressure() -> None:
    snapshot = a_t4_and_an_a10_node()
    assert not model_pressure(WorkloadDistribution((FREE,), (1.0,)), snapshot.layout).any()


def test_an_unpinned_pod_goes_where_pinned_demand_does_not_need_the_gpus() -> None:
    # In snapshot order the T4 node comes first.
    snapshot = a_cluster(a_node("t4").gpus(4, "T4"), a_node("a10").gpus(4, "A10"))
    workload = WorkloadDistribution((FREE, ON_T4), (0.6, 0.4))
    request = a_request("free").whole(1).cpu(4_000).build()
    assert place(snapshot, request, make_policy("ours", workload=workload)).bindings[0].node_id == "a10"
    pinned = a_request("pinned").whole(1).cpu(4_000).of_models("T4").build()
    assert place(snapshot, pinned, make_policy("ours", workload=workload)).bindings[0].node_id == "t4"


def test_without_pinned_demand_ours_scores_as_before() -> None:
    snapshot = a_cluster(a_node("t4").gpus(4, "T4"), a_node("a10").gpus(4, "A10"))
    workload = WorkloadDistribution((FREE, RequestShape(2_000, 500, 1)), (0.5, 0.5))
    request = a_request("r").share(500).cpu(2_000).build()
    with_scarcity = make_policy("ours", workload=workload)
    decision = place(snapshot, request, with_scarcity)
    assert decision.bindings[0].node_id == "t4"
    assert np.isclose(with_scarcity.pressure_for(snapshot.layout) is None, True)  # type: ignore[attr-defined]


def test_only_a_model_short_of_what_its_pinned_demand_still_needs_costs_anything() -> None:
    snapshot = a_t4_and_an_a10_node()
    nodes = np.arange(2)
    free = a_request("free").whole(1).cpu(4_000).build()
    pinned = a_request("pinned").whole(1).cpu(4_000).of_models("T4").build()
    short = model_pressure(WorkloadDistribution((FREE, ON_T4), (0.4, 0.6)), snapshot.layout)  # T4: 1.2
    cost = scarcity_cost(short, ModelIndex.of(snapshot.layout), snapshot, free, nodes, per_gpu=False)
    assert cost[0].max() == 0 and cost[1].min() == pytest.approx(400.0)  # (1.2 - 0.8) x 1000 milli
    assert not scarcity_cost(short, ModelIndex.of(snapshot.layout), snapshot, pinned, nodes, per_gpu=False).any()
    spare = model_pressure(WorkloadDistribution((FREE, ON_T4), (0.7, 0.3)), snapshot.layout)  # T4: 0.6
    assert not scarcity_cost(spare, ModelIndex.of(snapshot.layout), snapshot, free, nodes, per_gpu=False).any()
