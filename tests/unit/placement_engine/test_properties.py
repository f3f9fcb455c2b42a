"""Hypothesis properties of the core: capacity, reversibility, determinism, gangs, MIG positions."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched_core.placement import (
    MIG_FAMILIES,
    ClusterSnapshot,
    GangRequest,
    PodRequest,
    RequestId,
    apply,
    make_policy,
    mig_profile,
    place,
    policy_names,
    release,
)

from .builders import a_cluster, a_node, a_request

PROPERTY_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def clusters(draw: st.DrawFn) -> ClusterSnapshot:
    count = draw(st.integers(1, 5))
    nodes = []
    for i in range(count):
        node = a_node(f"n{i}").cpu(draw(st.sampled_from([4_000, 16_000, 64_000])))
        node.memory(draw(st.sampled_from([8_192, 65_536])))
        gpus = draw(st.integers(0, 8))
        if gpus:
            node.gpus(gpus, draw(st.sampled_from(["A10", "T4"])))
        nodes.append(node)
    return a_cluster(*nodes)


@st.composite
def requests(draw: st.DrawFn, prefix: str = "r") -> PodRequest:
    builder = a_request(f"{prefix}{draw(st.integers(0, 10**6))}")
    kind = draw(st.sampled_from(["whole", "share", "cpu"]))
    if kind == "whole":
        builder.whole(draw(st.integers(1, 8)))
    elif kind == "share":
        builder.share(draw(st.integers(1, 999)))
    builder.cpu(draw(st.sampled_from([0, 1_000, 4_000, 12_000])))
    builder.memory(draw(st.sampled_from([0, 1_024, 16_384])))
    if draw(st.booleans()):
        builder.of_models(draw(st.sampled_from(["A10", "T4"])))
    return builder.build()


def assert_within_capacity(snapshot: ClusterSnapshot) -> None:
    layout = snapshot.layout
    assert (snapshot.cpu_free >= 0).all() and (snapshot.cpu_free <= layout.cpu_capacity).all()
    assert (snapshot.memory_free >= 0).all() and (snapshot.memory_free <= layout.memory_capacity).all()
    assert (snapshot.gpu_milli_free >= 0).all() and (snapshot.gpu_milli_free <= 1000).all()
    assert (snapshot.gpu_memory_free >= 0).all()


@PROPERTY_SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=12, unique_by=lambda r: r.id),
       st.sampled_from(policy_names()), st.integers(0, 3))  # fmt: skip
def test_capacity_is_never_exceeded(snapshot, batch, policy_name, seed) -> None:  # noqa: ANN001
    policy = make_policy(policy_name, seed=seed)
    for request in batch:
        decision = place(snapshot, request, policy)
        if decision.placed:
            snapshot = apply(snapshot, decision)
        else:
            assert decision.unplaced_by_class, "a request that waits must say why"
            assert sum(c.node_count for c in decision.unplaced_by_class) == snapshot.layout.node_count
        assert_within_capacity(snapshot)


@PROPERTY_SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=6, unique_by=lambda r: r.id), requests("last"),
       st.sampled_from(policy_names()))  # fmt: skip
def test_a_placement_plus_its_release_restores_the_snapshot(snapshot, warmup, request, policy_name) -> None:  # noqa: ANN001
    policy = make_policy(policy_name)
    for earlier in warmup:
        decision = place(snapshot, earlier, policy)
        if decision.placed:
            snapshot = apply(snapshot, decision)
    decision = place(snapshot, request, policy)
    if not decision.placed:
        return
    restored = release(apply(snapshot, decision), decision.request_id)
    for name in ("cpu_free", "memory_free", "gpu_milli_free", "gpu_memory_free", "mig_used", "share_free",
                 "full_free_count", "max_share_free", "share_free_total"):  # fmt: skip
        assert np.array_equal(getattr(restored, name), getattr(snapshot, name)), name
    assert dict(restored.allocations) == dict(snapshot.allocations)


@PROPERTY_SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=8, unique_by=lambda r: r.id),
       st.sampled_from(policy_names()), st.integers(0, 5), st.one_of(st.none(), st.integers(0, 5)))  # fmt: skip
def test_the_same_snapshot_and_request_always_give_the_same_decision(snapshot, batch, policy_name, seed,
                                                                     tie_seed) -> None:  # noqa: ANN001
    warm = make_policy(policy_name, seed=seed)  # its memo caches fill up along the way
    for request in batch:
        first = place(snapshot, request, warm, tie_break_seed=tie_seed)
        again = place(snapshot, request, make_policy(policy_name, seed=seed), tie_break_seed=tie_seed)
        assert first == again
        if first.placed:
            snapshot = apply(snapshot, first)


@PROPERTY_SETTINGS
@given(clusters(), st.integers(1, 4), st.integers(1, 8), st.sampled_from(policy_names()))
def test_gangs_are_never_partial(snapshot, node_count, gpus_per_node, policy_name) -> None:  # noqa: ANN001
    gang = GangRequest(RequestId("gang"), node_count, gpus_per_node)
    decision = place(snapshot, gang, make_policy(policy_name))
    if decision.placed:
        assert len(decision.bindings) == node_count
        assert len(set(decision.node_ids)) == node_count
        assert all(len(b.gpu_indices) == gpus_per_node for b in decision.bindings)
        assert_within_capacity(apply(snapshot, decision))
    else:
        assert decision.bindings == ()
        feasible = (snapshot.full_free_count >= gpus_per_node).sum()
        assert feasible < node_count


MIG_MODELS = ["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"]


@PROPERTY_SETTINGS
@given(st.sampled_from(MIG_MODELS), st.integers(1, 3), st.lists(st.integers(0, 5), min_size=1, max_size=16))
def test_mig_slices_are_only_placed_at_valid_positions(model, gpus, picks) -> None:  # noqa: ANN001
    snapshot = a_cluster(a_node("n1").gpus(gpus, model).mig())
    family = MIG_FAMILIES[{"NVIDIA-A100-SXM4-40GB": "A100-40GB"}.get(model, "A100-80GB")]
    names = list(family)
    policy = make_policy("bestfit")
    for i, pick in enumerate(picks):
        request = a_request(f"m{i}").mig(names[pick]).build()
        decision = place(snapshot, request, policy)
        if not decision.placed:
            continue
        (binding,) = decision.bindings
        assert binding.mig is not None
        profile = mig_profile(model, binding.mig.profile)
        assert profile is not None and binding.mig.start in profile.starts
        snapshot = apply(snapshot, decision)  # refuses overlapping slices


@PROPERTY_SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=12, unique_by=lambda r: r.id), requests("late"),
       st.sampled_from(policy_names()))  # fmt: skip
def test_a_request_that_finds_no_room_finds_none_once_more_is_placed(snapshot, batch, late, policy_name) -> None:  # noqa: ANN001
    """What lets placement weigh only the jobs that came since its last cycle while the cluster stands as that
    cycle left it (``ClusterCache.queue_weighed``): placements only take room, so a request refused on a
    snapshot is refused on every snapshot that holds more."""
    policy = make_policy(policy_name)
    refused = [request for request in batch if not place(snapshot, request, policy).placed]
    for request in (late, *batch):
        decision = place(snapshot, request, policy)
        if decision.placed:
            snapshot = apply(snapshot, decision)
            assert not any(place(snapshot, r, policy).placed for r in refused)


@PROPERTY_SETTINGS
@given(clusters(), st.lists(requests(), min_size=1, max_size=8, unique_by=lambda r: r.id),
       st.sampled_from(policy_names()))  # fmt: skip
def test_the_summaries_an_update_keeps_equal_those_worked_out_afresh(snapshot, stream, policy_name) -> None:  # noqa: ANN001
    """An update recomputes the summaries of the nodes it touched only (in plain Python for a few): after any
    run of grants and releases they equal the summaries of the whole snapshot worked out again."""
    from gpusched_core.placement.snapshot import _derive_rows

    policy = make_policy(policy_name)
    placed = []
    for request in stream:
        decision = place(snapshot, request, policy)
        if decision.placed:
            snapshot = apply(snapshot, decision)
            placed.append(decision.request_id)
        if len(placed) > 2:
            snapshot = release(snapshot, placed.pop(0))
        afresh = _derive_rows(snapshot.layout, snapshot.gpu_milli_free, snapshot.gpu_healthy, snapshot.gpu_mig_mode)
        for name, values in zip(("share_free", "full_free_count", "max_share_free", "share_free_total"), afresh,
                                strict=True):  # fmt: skip
            kept = getattr(snapshot, name)
            assert kept.dtype == values.dtype and np.array_equal(kept, values), name
