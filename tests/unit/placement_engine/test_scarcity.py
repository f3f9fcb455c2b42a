"""``ours`` leaves the nodes that constrained demand needs (a pinned GPU model, or a size that fits only a
minority of the nodes) to the pods that need them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gpusched_core.placement import MILLI_PER_GPU, RequestShape, WorkloadDistribution, make_policy, place
from gpusched_core.placement.scarcity import NodeClasses, class_pressure, scarcity_cost

from .builders import NodeBuilder, RequestBuilder, a_cluster, a_node, a_request

FREE = RequestShape(4_000, MILLI_PER_GPU, 1)
ON_T4 = RequestShape(4_000, MILLI_PER_GPU, 1, frozenset({"T4"}))
# Eight GPUs and 120 CPUs: only a node with 128 CPUs has room (as openb's G3 nodes, 5% of its GPUs).
BIG = RequestShape(120_000, MILLI_PER_GPU, 8)
FOUR = RequestShape(16_000, MILLI_PER_GPU, 4)


def a_t4_and_an_a10_node():  # noqa: ANN201
    return a_cluster(a_node("a10").gpus(4, "A10"), a_node("t4").gpus(4, "T4"))


def a_big_node_first_then_two_regular_ones():  # noqa: ANN201
    return a_cluster(a_node("big").gpus(8, "G3").cpu(128_000), a_node("regular-1").gpus(8, "G3").cpu(96_000),
                     a_node("regular-2").gpus(8, "G3").cpu(96_000))  # fmt: skip


def pressure_by_node(workload: WorkloadDistribution, snapshot) -> dict[str, float]:  # noqa: ANN001
    classes = NodeClasses.of(snapshot.layout)
    pressure = class_pressure(workload, classes)
    return {str(node.id): round(float(pressure[k]), 3) for node, k in zip(snapshot.nodes, classes.node_class)}


def test_nodes_with_the_same_gpu_models_and_cpu_are_one_class() -> None:
    snapshot = a_big_node_first_then_two_regular_ones()
    classes = NodeClasses.of(snapshot.layout)
    assert classes.node_class.tolist() == [0, 1, 1]
    assert classes.count.tolist() == [8.0, 16.0]
    assert classes.fits(120_000, 8, frozenset()) == (True, False)
    assert classes.fits(4_000, 1, frozenset({"T4"})) == (False, False)


def test_pressure_is_the_share_of_a_model_its_pinned_demand_needs() -> None:
    snapshot = a_t4_and_an_a10_node()
    workload = WorkloadDistribution((FREE, ON_T4), (0.5, 0.5))
    assert pressure_by_node(workload, snapshot) == {"a10": 0.0, "t4": pytest.approx(1.0)}  # half the demand, GPUs


def test_a_shape_that_fits_a_minority_of_the_gpus_presses_on_the_nodes_it_fits() -> None:
    snapshot = a_big_node_first_then_two_regular_ones()
    workload = WorkloadDistribution((FREE, BIG), (0.9, 0.1))  # BIG: 800 of 1,700 milli asked, on a third of the GPUs
    pressure = pressure_by_node(workload, snapshot)
    assert pressure == {"big": pytest.approx(3 * 800 / 1_700, abs=1e-3), "regular-1": 0.0, "regular-2": 0.0}


@pytest.mark.parametrize("shapes", [(FREE,), (FREE, FOUR)], ids=["one GPU", "one and four GPUs"])
def test_shapes_that_fit_most_nodes_press_on_none(shapes: tuple[RequestShape, ...]) -> None:
    workload = WorkloadDistribution(shapes, tuple(1 / len(shapes) for _ in shapes))
    assert not any(pressure_by_node(workload, a_big_node_first_then_two_regular_ones()).values())


def test_only_a_model_short_of_what_its_pinned_demand_still_needs_costs_anything() -> None:
    snapshot = a_t4_and_an_a10_node()
    classes, nodes = NodeClasses.of(snapshot.layout), np.arange(2)
    free = a_request("free").whole(1).cpu(4_000).build()
    pinned = a_request("pinned").whole(1).cpu(4_000).of_models("T4").build()
    short = class_pressure(WorkloadDistribution((FREE, ON_T4), (0.4, 0.6)), classes)  # T4: 1.2
    cost = scarcity_cost(short, classes, snapshot, free, nodes)
    assert cost[0].max() == 0 and cost[1].min() == pytest.approx(400.0)  # (1.2 - 0.8) x 1000 milli
    assert not scarcity_cost(short, classes, snapshot, pinned, nodes).any()
    spare = class_pressure(WorkloadDistribution((FREE, ON_T4), (0.7, 0.3)), classes)  # T4: 0.6
    assert not scarcity_cost(spare, classes, snapshot, free, nodes).any()


def test_without_constrained_demand_ours_scores_as_before() -> None:
    snapshot = a_cluster(a_node("t4").gpus(4, "T4"), a_node("a10").gpus(4, "A10"))
    workload = WorkloadDistribution((FREE, RequestShape(2_000, 500, 1)), (0.5, 0.5))
    policy = make_policy("ours", workload=workload)
    assert place(snapshot, a_request("r").share(500).cpu(2_000).build(), policy).bindings[0].node_id == "t4"
    assert policy.pressure_for(snapshot.layout) is None  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Scenario:
    id: str
    nodes: tuple[NodeBuilder, ...]
    workload: WorkloadDistribution
    request: RequestBuilder
    node: str


def _big_and_regular() -> tuple[NodeBuilder, ...]:
    """The big node first, then three regular ones: big pods fit a quarter of the GPUs."""
    return (a_node("big").gpus(8, "G3").cpu(128_000),
            *(a_node(f"regular-{i}").gpus(8, "G3").cpu(96_000) for i in (1, 2, 3)))  # fmt: skip


# Big pods 4% of the pods (FGD's typical 95% leaves them out, so FGD sees no reason to avoid the big node)
# but a quarter of the GPU asked, on a quarter of the GPUs: pressure 1.0. At 1% of the pods: 0.3.
MANY_BIG = WorkloadDistribution((FREE, BIG), (0.96, 0.04))
FEW_BIG = WorkloadDistribution((FREE, BIG), (0.99, 0.01))
T4_PINNED = WorkloadDistribution((FREE, ON_T4), (0.6, 0.4))


def _t4_then_a10() -> tuple[NodeBuilder, ...]:
    return a_node("t4").gpus(4, "T4"), a_node("a10").gpus(4, "A10")


SCENARIOS = [
    Scenario("an unpinned pod goes where pinned demand does not need the GPUs",
             _t4_then_a10(), T4_PINNED,
             a_request("free").whole(1).cpu(4_000), "a10"),
    Scenario("a pinned pod takes the GPUs its pinned demand needs",
             _t4_then_a10(), T4_PINNED,
             a_request("pinned").whole(1).cpu(4_000).of_models("T4"), "t4"),
    Scenario("a one-GPU pod stays off the only node that big pods fit",
             _big_and_regular(), MANY_BIG,
             a_request("small").whole(1).cpu(4_000), "regular-1"),
    Scenario("a share stays off it too",
             _big_and_regular(), MANY_BIG,
             a_request("share").share(500).cpu(2_000), "regular-1"),
    Scenario("a big pod takes it",
             _big_and_regular(), MANY_BIG,
             a_request("big-pod").whole(8).cpu(120_000), "big"),
    Scenario("with few big pods to come the node is free to use (node order decides)",
             _big_and_regular(), FEW_BIG,
             a_request("small").whole(1).cpu(4_000), "big"),
]  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_ours_leaves_constrained_demand_its_nodes(scenario: Scenario) -> None:
    snapshot = a_cluster(*scenario.nodes)
    decision = place(snapshot, scenario.request.build(), make_policy("ours", workload=scenario.workload))
    assert decision.placed and decision.bindings[0].node_id == scenario.node


@pytest.mark.parametrize("request_", [a_request("small").whole(1).cpu(4_000), a_request("share").share(500).cpu(2_000)],
                         ids=["one GPU", "a share"])  # fmt: skip
def test_fgd_alone_would_take_the_big_node_first(request_: RequestBuilder) -> None:
    """What the scenarios above change: FGD's typical shapes leave the big pods out."""
    decision = place(a_cluster(*_big_and_regular()), request_.build(), make_policy("fgd", workload=MANY_BIG))
    assert decision.bindings[0].node_id == "big"
