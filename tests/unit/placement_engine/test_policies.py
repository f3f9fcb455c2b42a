"""Policy formulas and the FGD machinery: growth equals the measured change, memo equals fresh."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.placement import (
    RequestShape,
    WorkloadDistribution,
    apply,
    default_workload,
    make_policy,
    node_fragmentation,
    place,
    policy_infos,
)
from gpusched_core.placement.fgd import FragmentationMemo, frag_growth, sigmoid_score
from gpusched_core.placement.fragmentation import shape_arrays
from gpusched_core.placement.policies import BestFitPolicy, Candidates, PackingPolicy

from .builders import a_cluster, a_node, a_request
from .test_properties import clusters, requests

WORKLOAD = WorkloadDistribution(
    (RequestShape(4_000, 500, 1), RequestShape(8_000, 1000, 1), RequestShape(16_000, 1000, 2),
     RequestShape(2_000, 250, 1, frozenset({"T4"})), RequestShape(12_000)),
    (0.3, 0.3, 0.1, 0.2, 0.1),
)  # fmt: skip


def test_the_published_baselines_and_ours_are_registered() -> None:
    published = {info.name: info.published_as for info in policy_infos() if info.published_as}
    assert published == {"random": "01-Random", "dotprod": "02-DotProd", "packing": "04-GpuPacking",
                         "bestfit": "05-BestFit", "fgd": "06-FGD"}  # fmt: skip
    assert any(info.own for info in policy_infos())


def test_bestfit_scores_the_weighted_leftover_of_the_largest_node() -> None:
    snapshot = a_cluster(a_node("n1").gpus(8).cpu(128_000), a_node("n2").gpus(2).cpu(32_000))
    request = a_request("r").whole(1).cpu(16_000).build()
    scores = BestFitPolicy().score(Candidates(snapshot, request, np.array([0, 1])))
    # n1: 1 - (0.5 * 112/128 + 0.5 * 7/8) = 0.125 -> 12; n2: 1 - (0.5 * 16/128 + 0.5 * 1/8) = 0.875 -> 87
    assert scores.values.tolist() == [12.0, 87.0]


def test_packing_prefers_shared_gpus_then_used_nodes_then_idle_nodes() -> None:
    from gpusched_core.placement import Binding, NodeId, RequestId, apply_bindings

    snapshot = a_cluster(a_node("idle").gpus(4), a_node("used").gpus(4), a_node("shared").gpus(4))
    snapshot = apply_bindings(snapshot, RequestId("x"), [Binding(NodeId("used"), (0,), gpu_milli=1000),
                                                          Binding(NodeId("shared"), (0,), gpu_milli=300)])  # fmt: skip
    scores = PackingPolicy().score(Candidates(snapshot, a_request("r").share(200).build(), np.array([0, 1, 2])))
    idle, used, shared = scores.values.tolist()
    assert shared > used > idle


def test_the_fgd_score_is_the_truncated_sigmoid_of_the_growth() -> None:
    assert sigmoid_score(np.array([0.0, 1000.0, -1000.0, np.inf])).tolist() == [50.0, 26.0, 73.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(clusters(), st.lists(requests(), min_size=0, max_size=5, unique_by=lambda r: r.id), requests("probe"),
       st.sampled_from(["fgd", "capped"]))  # fmt: skip
def test_growth_equals_the_measured_change_of_node_fragmentation(snapshot, warmup, probe, measure) -> None:  # noqa: ANN001
    policy = make_policy("bestfit")
    for request in warmup:
        decision = place(snapshot, request, policy)
        if decision.placed:
            snapshot = apply(snapshot, decision)
    decision = place(snapshot, probe, policy)
    if not decision.placed:
        return
    row = snapshot.node_index(decision.bindings[0].node_id)
    shapes = shape_arrays(WORKLOAD, snapshot.layout)
    growth = frag_growth(snapshot, probe, shapes, np.array([row]), measure)[0]
    before = node_fragmentation(snapshot, WORKLOAD, measure)[row]
    after = node_fragmentation(apply(snapshot, decision), WORKLOAD, measure)[row]
    column = decision.bindings[0].gpu_indices[0] if decision.bindings[0].gpu_indices else 0
    assert growth[column] == pytest.approx(after - before, abs=1e-6)


def test_the_memo_gives_what_a_fresh_computation_gives_as_the_cluster_changes() -> None:
    snapshot = a_cluster(*(a_node(f"n{i}").gpus(4, "T4" if i % 2 else "A10") for i in range(6)))
    memo = FragmentationMemo(WORKLOAD, ("capped",))
    policy = make_policy("ours", workload=WORKLOAD)
    shapes = shape_arrays(WORKLOAD, snapshot.layout)
    stream = [a_request(f"r{i}").share(250 + 50 * (i % 3)).cpu(2_000).build() for i in range(12)]
    stream += [a_request(f"w{i}").whole(1 + i % 2).cpu(4_000).build() for i in range(6)]
    for request in stream:
        rows = np.arange(snapshot.layout.node_count)
        fresh = frag_growth(snapshot, request, shapes, rows, "capped")
        assert np.array_equal(memo.growth(snapshot, request), fresh)
        decision = place(snapshot, request, policy)
        if decision.placed:
            snapshot = apply(snapshot, decision)


def test_ours_cuts_a_real_workload_at_90_percent_and_the_generic_mix_at_fgds_95() -> None:
    """A trace's long tail of rare shapes is cut at 90% (see ``frag_aware``); the generic mix the live
    service uses when it knows no workload is a handful of typical shapes and keeps FGD's cut-off."""
    generic = make_policy("ours")
    assert generic.popularity == 0.95  # type: ignore[attr-defined]
    assert make_policy("ours", workload=default_workload()).popularity == 0.9  # type: ignore[attr-defined]
