"""Scenario tables: one request kind per row, the node (and GPUs) it must land on."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpusched_core.placement import (
    Binding,
    ClusterSnapshot,
    MigPlacement,
    NodeId,
    RequestId,
    RequestShape,
    WorkloadDistribution,
    apply,
    apply_bindings,
    make_policy,
    place,
)

from .builders import NodeBuilder, RequestBuilder, a_cluster, a_node, a_request


def occupied(snapshot: ClusterSnapshot, node: str, *gpus: int, milli: int = 1000) -> ClusterSnapshot:
    binding = Binding(NodeId(node), gpu_indices=tuple(gpus), gpu_milli=milli)
    return apply_bindings(snapshot, RequestId(f"pre-{node}-{gpus}-{milli}"), [binding])


@dataclass(frozen=True)
class Scenario:
    id: str
    nodes: tuple[NodeBuilder, ...]
    request: RequestBuilder
    node: str
    gpus: tuple[int, ...] | None = None
    busy: tuple[tuple[str, tuple[int, ...], int], ...] = ()
    policy: str = "bestfit"


SCENARIOS = [
    Scenario("whole_gpus_go_where_enough_are_fully_free",
             (a_node("n1").gpus(8), a_node("n2").gpus(8)), a_request("r").whole(4), "n2",
             busy=(("n1", (0, 1, 2, 3, 4, 5), 1000),)),
    Scenario("bestfit_packs_a_share_onto_the_partly_used_gpu",
             (a_node("n1").gpus(2), a_node("n2").gpus(2)), a_request("r").share(300), "n2", (1,),
             busy=(("n2", (1,), 500),)),
    Scenario("a_model_list_excludes_other_models",
             (a_node("n1").gpus(8, "A10"), a_node("n2").gpus(2, "H100-80GB")),
             a_request("r").whole(1).of_models("H100-80GB"), "n2"),
    Scenario("a_node_selector_must_match",
             (a_node("n1").gpus(4), a_node("n2").gpus(4).label("pool", "inference")),
             a_request("r").whole(1).on("pool", "inference"), "n2"),
    Scenario("a_node_short_of_cpu_is_skipped",
             (a_node("n1").gpus(4).cpu(2_000), a_node("n2").gpus(4).cpu(64_000)),
             a_request("r").whole(1).cpu(8_000), "n2"),
    Scenario("a_node_short_of_memory_is_skipped",
             (a_node("n1").gpus(4).memory(1_024), a_node("n2").gpus(4)),
             a_request("r").whole(1).memory(8_192), "n2"),
    Scenario("a_share_needs_gpu_memory_as_well_as_milli",
             (a_node("n1").gpus(2, memory_mib=16_000), a_node("n2").gpus(2, memory_mib=80_000)),
             a_request("r").share(200, memory_mib=40_000), "n2"),
    Scenario("unhealthy_gpus_are_never_used",
             (a_node("n1").gpus(2).unhealthy(0, 1), a_node("n2").gpus(2).unhealthy(0)),
             a_request("r").whole(1), "n2", (1,)),
    Scenario("two_gpus_stay_in_the_tightest_nvlink_domain",
             (a_node("n1").gpus(8).nvlink_domains(0, 0, 0, 0, 1, 1, 1, 1),), a_request("r").whole(2), "n1",
             (2, 3), busy=(("n1", (0, 1), 1000),)),
    Scenario("three_gpus_go_to_the_domain_that_holds_them",
             (a_node("n1").gpus(8).nvlink_domains(0, 0, 0, 0, 1, 1, 1, 1),), a_request("r").whole(3), "n1",
             (4, 5, 6), busy=(("n1", (0, 1), 1000),)),
    Scenario("a_mig_slice_needs_a_mig_enabled_gpu_of_its_family",
             (a_node("n1").gpus(1, "NVIDIA-A100-SXM4-80GB"), a_node("n2").gpus(1, "NVIDIA-A100-SXM4-80GB").mig()),
             a_request("r").mig("3g.40gb"), "n2", (0,)),
    Scenario("a_cpu_only_request_needs_no_gpu",
             (a_node("n1").cpu(8_000), a_node("n2").gpus(1).cpu(2_000)), a_request("r").cpu(4_000), "n1", ()),
    Scenario("fgd_keeps_the_last_whole_gpu_free",
             (a_node("n1").gpus(2),), a_request("r").share(500), "n1", (0,),
             busy=(("n1", (0,), 400),), policy="fgd"),
]  # fmt: skip


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_request_lands_on_the_expected_node(scenario: Scenario) -> None:
    snapshot = a_cluster(*scenario.nodes)
    for node, gpus, milli in scenario.busy:
        snapshot = occupied(snapshot, node, *gpus, milli=milli)
    decision = place(snapshot, scenario.request.build(), make_policy(scenario.policy))
    assert decision.placed, decision.reasons
    (binding,) = decision.bindings
    assert binding.node_id == scenario.node
    if scenario.gpus is not None:
        assert binding.gpu_indices == scenario.gpus
    assert decision.reasons and scenario.policy in decision.reasons[0]
    apply(snapshot, decision)  # a placed decision always applies cleanly


def test_fgd_avoids_stranding_a_sliver_where_bestfit_packs() -> None:
    snapshot = occupied(a_cluster(a_node("n1").gpus(2)), "n1", 0, milli=400)
    workload = WorkloadDistribution((RequestShape(0, 500, 1),), (1.0,))
    fgd = place(snapshot, a_request("r").share(500).build(), make_policy("fgd", workload=workload))
    bestfit = place(snapshot, a_request("r").share(500).build(), make_policy("bestfit"))
    # On GPU 0 (600 free) a 500-share strands 100 milli no 500-share can use; on GPU 1 nothing is lost.
    assert fgd.bindings[0].gpu_indices == (1,)
    assert bestfit.bindings[0].gpu_indices == (0,)


def test_mig_slices_fill_valid_positions_then_report_no_position() -> None:
    snapshot = a_cluster(a_node("n1").gpus(1, "NVIDIA-A100-SXM4-80GB").mig())
    starts = []
    for i in range(3):
        decision = place(snapshot, a_request(f"m{i}").mig("3g.40gb").build(), make_policy("bestfit"))
        if not decision.placed:
            assert "no free MIG position for 3g.40gb" in decision.reasons[1]
            break
        mig = decision.bindings[0].mig
        assert isinstance(mig, MigPlacement)
        starts.append(mig.start)
        snapshot = apply(snapshot, decision)
    assert sorted(starts) == [0, 4]
