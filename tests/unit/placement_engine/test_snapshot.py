"""Snapshot invariants: no over-allocation, exact release, immutability."""

from __future__ import annotations

import numpy as np
import pytest

from gpusched_core.placement import (
    Binding,
    MigPlacement,
    NodeId,
    PlacementError,
    RequestId,
    apply_bindings,
    apply_many,
    release,
    with_gpu_state,
)

from .builders import a_cluster, a_node


def test_granting_more_than_a_gpu_has_is_refused() -> None:
    snapshot = a_cluster(a_node("n1").gpus(1))
    half = Binding(NodeId("n1"), (0,), gpu_milli=600)
    taken = apply_bindings(snapshot, RequestId("a"), [half])
    with pytest.raises(PlacementError, match="over capacity"):
        apply_bindings(taken, RequestId("b"), [half])


def test_an_allocation_id_is_granted_once() -> None:
    snapshot = a_cluster(a_node("n1").gpus(2))
    binding = Binding(NodeId("n1"), (0,), gpu_milli=100)
    taken = apply_bindings(snapshot, RequestId("a"), [binding])
    with pytest.raises(PlacementError, match="already exists"):
        apply_bindings(taken, RequestId("a"), [binding])


def test_cpu_and_memory_are_never_overcommitted() -> None:
    snapshot = a_cluster(a_node("n1").cpu(1_000).memory(512))
    with pytest.raises(PlacementError):
        apply_bindings(snapshot, RequestId("a"), [Binding(NodeId("n1"), cpu_milli=2_000)])


def test_overlapping_mig_slices_are_refused_and_bad_starts_rejected() -> None:
    snapshot = a_cluster(a_node("n1").gpus(1, "H100-80GB").mig())
    first = Binding(NodeId("n1"), (0,), mig=MigPlacement("3g.40gb", 4))
    taken = apply_bindings(snapshot, RequestId("a"), [first])
    with pytest.raises(PlacementError, match="already used"):
        apply_bindings(taken, RequestId("b"), [Binding(NodeId("n1"), (0,), mig=MigPlacement("1g.10gb", 5))])
    with pytest.raises(PlacementError, match="not a valid MIG placement"):
        apply_bindings(snapshot, RequestId("c"), [Binding(NodeId("n1"), (0,), mig=MigPlacement("2g.20gb", 1))])


def test_release_restores_the_free_capacity_exactly() -> None:
    snapshot = a_cluster(a_node("n1").gpus(4), a_node("n2").gpus(4))
    bindings = [Binding(NodeId("n1"), (1, 2), gpu_milli=1000, cpu_milli=3_000, memory_mib=100),
                Binding(NodeId("n2"), (0,), gpu_milli=250, gpu_memory_mib=4_000)]  # fmt: skip
    back = release(apply_bindings(snapshot, RequestId("a"), bindings), RequestId("a"))
    for name in ("cpu_free", "memory_free", "gpu_milli_free", "gpu_memory_free", "share_free", "full_free_count"):
        assert np.array_equal(getattr(back, name), getattr(snapshot, name)), name
    assert dict(back.allocations) == {}


def test_the_old_snapshot_is_untouched_and_read_only() -> None:
    snapshot = a_cluster(a_node("n1").gpus(2))
    apply_bindings(snapshot, RequestId("a"), [Binding(NodeId("n1"), (0,), gpu_milli=1000)])
    assert int(snapshot.full_free_count[0]) == 2
    with pytest.raises(ValueError):
        snapshot.share_free[0, 0] = 0


def test_an_unhealthy_gpu_leaves_the_free_pool_and_mig_mode_needs_an_idle_gpu() -> None:
    snapshot = a_cluster(a_node("n1").gpus(2, "A100-SXM4-40GB"))
    sick = with_gpu_state(snapshot, NodeId("n1"), 1, healthy=False)
    assert sick.share_free[0].tolist() == [1000, 0]
    busy = apply_bindings(snapshot, RequestId("a"), [Binding(NodeId("n1"), (0,), gpu_milli=100)])
    with pytest.raises(PlacementError, match="in use"):
        with_gpu_state(busy, NodeId("n1"), 0, mig_enabled=True)
    mig = with_gpu_state(busy, NodeId("n1"), 1, mig_enabled=True)
    assert mig.share_free[0].tolist() == [900, 0]


def test_many_allocations_at_once_equal_one_by_one_and_are_checked_the_same() -> None:
    snapshot = a_cluster(a_node("n1").gpus(4), a_node("n2").gpus(2, "H100-80GB").mig())
    items = [(RequestId("a"), [Binding(NodeId("n1"), (0, 1), gpu_milli=1000)]),
             (RequestId("b"), [Binding(NodeId("n1"), (2,), gpu_milli=300, gpu_memory_mib=1_000)]),
             (RequestId("c"), [Binding(NodeId("n2"), (0,), mig=MigPlacement("3g.40gb", 4))])]
    one_by_one = snapshot
    for allocation_id, bindings in items:
        one_by_one = apply_bindings(one_by_one, allocation_id, bindings)
    at_once = apply_many(snapshot, items)
    for name in ("cpu_free", "gpu_milli_free", "gpu_memory_free", "mig_used", "share_free", "full_free_count",
                 "max_share_free"):
        assert np.array_equal(getattr(at_once, name), getattr(one_by_one, name)), name
    assert at_once.allocations == one_by_one.allocations
    with pytest.raises(PlacementError, match="over capacity"):
        apply_many(snapshot, [*items, (RequestId("d"), [Binding(NodeId("n1"), (2,), gpu_milli=800)])])
    with pytest.raises(PlacementError, match="already exists"):
        apply_many(snapshot, [items[0], items[0]])


def test_an_update_remembers_its_parent_weakly_and_the_nodes_it_touched() -> None:
    snapshot = a_cluster(a_node("n1").gpus(2), a_node("n2").gpus(2), a_node("n3").gpus(2))
    first = apply_bindings(snapshot, RequestId("a"), [Binding(NodeId("n2"), (0,), gpu_milli=500)])
    second = apply_bindings(first, RequestId("b"), [Binding(NodeId("n3"), (1,), gpu_milli=1_000),
                                                    Binding(NodeId("n1"), (), cpu_milli=100)])  # fmt: skip
    assert first.touched_since(snapshot).tolist() == [1]
    assert second.touched_since(first).tolist() == [0, 2]
    assert second.touched_since(snapshot).tolist() == [0, 1, 2]  # two updates: the union
    assert snapshot.touched_since(first) is None  # not an ancestor
    released = release(second, RequestId("a"))
    assert released.touched_since(second).tolist() == [1]
    del first  # nothing else holds it: the lineage through it ends
    assert second.touched_since(snapshot) is None
    assert a_cluster(a_node("n1").gpus(2)).lineage is None  # a snapshot built anew has none


def test_the_engine_state_stepped_over_the_touched_nodes_equals_a_full_comparison() -> None:
    """``RowState`` steps over the nodes an update touched when the lineage tells them, else compares every
    node: both leave the same state (the kernel's step and numpy's)."""
    from gpusched_core.placement import kernel, make_policy, place, workload_from_requests
    from gpusched_core.placement.row_state import RowState

    from .builders import a_request

    nodes = [a_node(f"n{i}").gpus(4).cpu(32_000) for i in range(12)]
    requests = [(a_request(f"r{i}").whole(1 + i % 3) if i % 2 else a_request(f"r{i}").share(250 * (1 + i % 3)))
                .cpu(1_000 * (1 + i % 5)).build() for i in range(20)]  # fmt: skip
    workload = workload_from_requests(requests)
    for in_c in ([True, False] if kernel.built() else [False]):
        enabled = kernel.ENABLED
        kernel.use(in_c)
        try:
            snapshot, policy = a_cluster(*nodes), make_policy("bestfit")
            stepped, compared = RowState(workload), RowState(workload)
            stepped.sync(snapshot, ("fgd", "capped"))
            compared.sync(snapshot, ("fgd", "capped"))
            for request in requests:
                decision = place(snapshot, request, policy)
                if not decision.placed:
                    continue
                parent, snapshot = snapshot, apply_bindings(snapshot, request.id, decision.bindings)
                assert snapshot.touched_since(parent) is not None
                stepped.sync(snapshot, ("fgd", "capped"))
                compared.snapshot = parent.__class__(**{**parent.__dict__, "lineage": None})  # same state, no lineage
                compared.sync(snapshot, ("fgd", "capped"))
                for mine, theirs in ((stepped.version, compared.version), (stepped.count, compared.count),
                                     (stepped.usable, compared.usable), (stepped.cpu_class, compared.cpu_class),
                                     (stepped.before["fgd"], compared.before["fgd"])):  # fmt: skip
                    np.testing.assert_array_equal(mine, theirs)
        finally:
            kernel.use(enabled)
