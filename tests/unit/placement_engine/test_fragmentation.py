"""Fragmentation against a workload: hand-computed cases and the MIG slice rules."""

from __future__ import annotations

import pytest

from gpusched_core.placement import (
    Binding,
    MigPlacement,
    NodeId,
    RequestId,
    RequestShape,
    WorkloadDistribution,
    apply_bindings,
    cluster_fragmentation,
    node_fragmentation,
    workload_from_requests,
)
from gpusched_core.placement.mig import MIG_FAMILIES, free_starts, mig_family, stranded_slices

from .builders import a_cluster, a_node, a_request

SHARE_500 = RequestShape(0, 500, 1)
WHOLE_1 = RequestShape(0, 1000, 1)
WHOLE_2 = RequestShape(0, 1000, 2)


def one_node_with_gpu0_at(used_milli: int, cpu_milli: int = 64_000):
    snapshot = a_cluster(a_node("n1").gpus(2).cpu(cpu_milli))
    return apply_bindings(snapshot, RequestId("x"), [Binding(NodeId("n1"), (0,), gpu_milli=used_milli)])


CASES = [
    ("a_sliver_smaller_than_every_request_is_fragment", [(SHARE_500, 1.0)], 700, 300.0),
    ("a_node_that_cannot_host_the_shape_is_all_fragment", [(WHOLE_2, 1.0)], 700, 1300.0),
    ("cpu_only_shapes_count_all_free_gpu", [(RequestShape(1000), 1.0)], 700, 1300.0),
    ("weights_mix_the_shapes", [(SHARE_500, 0.5), (WHOLE_2, 0.5)], 700, 0.5 * 300 + 0.5 * 1300),
    ("a_shape_short_of_cpu_cannot_use_the_node", [(RequestShape(128_000, 500, 1), 1.0)], 0, 2000.0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "mix", "used", "expected"), CASES, ids=[c[0] for c in CASES])
def test_node_fragmentation_matches_hand_computation(case, mix, used, expected) -> None:  # noqa: ANN001
    snapshot = one_node_with_gpu0_at(used) if used else a_cluster(a_node("n1").gpus(2))
    workload = WorkloadDistribution(tuple(s for s, _ in mix), tuple(w for _, w in mix))
    assert node_fragmentation(snapshot, workload)[0] == pytest.approx(expected)


def test_cluster_fragmentation_is_reported_against_capacity_and_free_gpu() -> None:
    snapshot = one_node_with_gpu0_at(700)
    report = cluster_fragmentation(snapshot, WorkloadDistribution((SHARE_500,), (1.0,)))
    assert report.fragmented_milli == pytest.approx(300)
    assert report.fragmentation_pct == pytest.approx(15.0)
    assert report.fragmentation_ratio_pct == pytest.approx(300 / 1300 * 100)


def test_the_workload_keeps_the_most_popular_shapes_up_to_the_threshold() -> None:
    requests = [a_request(f"s{i}").share(500).build() for i in range(6)]
    requests += [a_request(f"w{i}").whole(1).build() for i in range(3)]
    requests += [a_request("rare").whole(8).build()]
    workload = workload_from_requests(requests, popularity=0.9)
    assert workload.shapes == (SHARE_500, WHOLE_1)
    assert workload.weights == pytest.approx((6 / 9, 3 / 9))


@pytest.mark.parametrize("model,family", [("NVIDIA-A100-SXM4-40GB", "A100-40GB"), ("A100-80GB", "A100-80GB"),
                                          ("NVIDIA-H100-80GB-HBM3", "H100-80GB"), ("T4", None)])  # fmt: skip
def test_gpu_models_map_to_their_mig_family(model: str, family: str | None) -> None:
    assert mig_family(model) == family


def test_mig_profiles_start_only_at_their_valid_slices() -> None:
    profiles = MIG_FAMILIES["A100-40GB"]
    assert profiles["1g.5gb"].starts == (0, 1, 2, 3, 4, 5, 6)
    assert profiles["3g.20gb"].starts == (0, 4)
    assert profiles["7g.40gb"].starts == (0,)
    assert free_starts(profiles["2g.10gb"], used_mask=0b0000_0011) == (2, 4)


def test_free_mig_slices_no_profile_position_can_use_are_fragment() -> None:
    profiles = MIG_FAMILIES["A100-80GB"]
    used = 0b0011_1111  # slices 0-5 taken; 6 and 7 free
    assert stranded_slices(profiles["1g.10gb"], used) == 1  # 1g fits at 6, slice 7 stays unusable
    assert stranded_slices(profiles["2g.20gb"], used) == 2  # 2g starts only at 0, 2, 4
    assert stranded_slices(profiles["1g.20gb"], used) == 0  # 1g.20gb at 6 covers 6-7


def test_mig_fragmentation_counts_stranded_slices_in_gpu_milli() -> None:
    snapshot = a_cluster(a_node("n1").gpus(1, "A100-80GB").mig())
    snapshot = apply_bindings(snapshot, RequestId("a"), [Binding(NodeId("n1"), (0,), mig=MigPlacement("3g.40gb", 0))])
    snapshot = apply_bindings(snapshot, RequestId("b"), [Binding(NodeId("n1"), (0,), mig=MigPlacement("2g.20gb", 4))])
    workload = WorkloadDistribution((RequestShape(0, mig_profile="2g.20gb"),), (1.0,))
    assert node_fragmentation(snapshot, workload)[0] == pytest.approx(2 * 125)
