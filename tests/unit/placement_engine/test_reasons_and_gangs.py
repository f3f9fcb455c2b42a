"""Why a request waits (per class of node), and gangs: all members or none, one domain if it fits."""

from __future__ import annotations

import numpy as np

from gpusched_core.placement import NodeClassReason, apply, make_policy, place, place_whole_gpus

from .builders import a_cluster, a_gang, a_node, a_request


def test_an_unplaceable_request_lists_the_first_failed_check_per_class_of_node() -> None:
    snapshot = a_cluster(
        a_node("a10-1").gpus(4, "A10"), a_node("a10-2").gpus(4, "A10"),
        a_node("h100-small").gpus(8, "H100-80GB").cpu(4_000),
        a_node("h100-big").gpus(2, "H100-80GB"),
    )  # fmt: skip
    request = a_request("train").whole(4).cpu(8_000).of_models("H100-80GB").build()
    decision = place(snapshot, request, make_policy("bestfit"))
    assert not decision.placed
    assert decision.unplaced_by_class == (
        NodeClassReason("no GPU of an allowed model (H100-80GB)", 2),
        NodeClassReason("less than 8000 CPU milli free", 1),
        NodeClassReason("fewer than 4 fully free GPUs", 1),
    )
    assert "2 nodes: no GPU of an allowed model (H100-80GB)" in decision.reasons


def test_the_simple_entry_point_places_whole_gpus_of_an_allowed_model() -> None:
    snapshot = a_cluster(a_node("n1").gpus(8, "A10"), a_node("n2").gpus(8, "H100-80GB"))
    decision = place_whole_gpus(snapshot, "job-1", 4, allowed_models={"H100-80GB"})
    assert decision.placed and decision.node_ids == ("n2",)
    assert len(decision.bindings[0].gpu_indices) == 4


def test_a_gang_lands_on_distinct_nodes() -> None:
    snapshot = a_cluster(*(a_node(f"n{i}").gpus(8) for i in range(3)))
    decision = place(snapshot, a_gang("g", nodes=2, gpus_per_node=8), make_policy("bestfit"))
    assert decision.placed and len(set(decision.node_ids)) == 2
    assert all(len(b.gpu_indices) == 8 for b in decision.bindings)


def test_gang_job_is_not_partially_bound_when_one_node_is_short() -> None:
    snapshot = a_cluster(a_node("n1").gpus(8), a_node("n2").gpus(8), a_node("n3").gpus(4))
    decision = place(snapshot, a_gang("g", nodes=3, gpus_per_node=8), make_policy("fgd"))
    assert not decision.placed and decision.bindings == ()
    assert "only 2 of 3 members fit" in decision.reasons[0]
    assert NodeClassReason("already used by this gang", 2) in decision.unplaced_by_class
    assert NodeClassReason("fewer than 8 fully free GPUs", 1) in decision.unplaced_by_class


def test_a_gang_stays_in_the_tightest_topology_block_that_fits() -> None:
    snapshot = a_cluster(
        a_node("a1").gpus(8).block("a"), a_node("a2").gpus(8).block("a"), a_node("a3").gpus(8).block("a"),
        a_node("b1").gpus(8).block("b"), a_node("b2").gpus(8).block("b"),
    )  # fmt: skip
    two = place(snapshot, a_gang("g2", nodes=2, gpus_per_node=4), make_policy("bestfit"))
    three = place(snapshot, a_gang("g3", nodes=3, gpus_per_node=4), make_policy("bestfit"))
    four = place(snapshot, a_gang("g4", nodes=4, gpus_per_node=4), make_policy("bestfit"))
    assert set(two.node_ids) == {"b1", "b2"}
    assert set(three.node_ids) == {"a1", "a2", "a3"}
    assert four.placed and "spread over the cluster" in four.reasons[0]


def test_a_gang_releases_as_one_allocation() -> None:
    from gpusched_core.placement import release

    snapshot = a_cluster(*(a_node(f"n{i}").gpus(8) for i in range(2)))
    decision = place(snapshot, a_gang("g", nodes=2, gpus_per_node=8), make_policy("bestfit"))
    taken = apply(snapshot, decision)
    assert int(taken.full_free_count.sum()) == 0
    back = release(taken, decision.request_id)
    assert np.array_equal(back.share_free, snapshot.share_free)
