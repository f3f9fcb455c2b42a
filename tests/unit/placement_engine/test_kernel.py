"""The C kernel computes what the numpy code computes: node statistics, growth and each node's best score.

Both sides run on the same clusters (mixed GPU models and counts, MIG, unhealthy GPUs) filled step by step
with every kind of request, and must agree exactly: the growth after the rounding both apply, the scores
as they are. The decisions themselves are compared with the plain reference in
``test_policy_speed_equivalence.py``, with the kernel and without.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.placement import (
    Binding,
    GangRequest,
    Gpu,
    GpuShare,
    Node,
    NodeId,
    PodRequest,
    RequestId,
    WholeGpus,
    apply,
    apply_bindings,
    build_snapshot,
    make_policy,
    place,
    workload_from_requests,
)
from gpusched_core.placement import kernel
from gpusched_core.placement.frag_aware import FragAwarePolicy
from gpusched_core.placement.growth import growth_rows
from gpusched_core.placement.row_state import RowState

from .test_policy_speed_equivalence import _pods, a_mixed_cluster, a_mixed_stream

MEASURES = ("fgd", "capped")


def test_the_kernel_is_built() -> None:
    assert kernel.built(), "the placement kernel is not built: `make install` needs a C compiler (gcc)"


def test_the_kernel_is_built_from_the_source_as_it_is() -> None:
    """A build that fails (the extension is optional) leaves the last one in place: tests would then run an
    older kernel than ``_kernel.c`` says. setup.py compiles the source's digest in."""
    if not kernel.built():
        pytest.skip("the kernel is not built (test_the_kernel_is_built fails)")
    source = Path(kernel.__file__).with_name("_kernel.c")
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    assert kernel._kernel.SOURCE == digest, (
        "the built placement kernel is older than _kernel.c: its last build failed (run `make install` and read "
        "the compiler's errors)")


@pytest.fixture(autouse=True)
def _numpy_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test turns the kernel on where it means to: the numpy side must not use it."""
    if not kernel.built():
        pytest.skip("the kernel is not built (test_the_kernel_is_built fails)")
    monkeypatch.setattr(kernel, "ENABLED", False)


def _clusters(seed: int, steps: int = 4):
    """(snapshot, pods, workload) at several fill levels of one mixed cluster."""
    rng = np.random.default_rng(seed)
    snapshot = a_mixed_cluster(rng, 30)
    requests = a_mixed_stream(rng, 160)
    pods = _pods(requests)
    workload = workload_from_requests(pods, popularity=0.9)
    filler = make_policy("bestfit")
    per_step = len(requests) // steps
    for step in range(steps):
        yield snapshot, pods, workload
        for request in requests[step * per_step:(step + 1) * per_step]:
            decision = place(snapshot, request, filler)
            if decision.placed:
                snapshot = apply(snapshot, decision)


def _numpy_state(workload, snapshot) -> RowState:
    state = RowState(workload)
    state.sync(snapshot, MEASURES)
    return state


@given(seed=st.integers(0, 10_000))
@settings(max_examples=12, deadline=None)
def test_node_statistics_equal_numpy(seed: int) -> None:
    for snapshot, _, workload in _clusters(seed):
        state = _numpy_state(workload, snapshot)
        rows = np.arange(snapshot.layout.node_count)
        count, usable = np.zeros_like(state.count), np.zeros_like(state.usable)
        before = {m: np.zeros_like(state.before[m]) for m in MEASURES}
        klass = np.zeros_like(state.cpu_class)
        kernel.stats(state.tables, MEASURES, snapshot, rows, count, usable, before, klass)
        np.testing.assert_array_equal(count, state.count)
        np.testing.assert_array_equal(usable, state.usable)
        np.testing.assert_array_equal(klass, state.cpu_class)
        for measure in MEASURES:  # the same sums, maybe in another order: equal to far below the rounding
            np.testing.assert_allclose(before[measure], state.before[measure], rtol=0, atol=1e-9)


@given(seed=st.integers(0, 10_000))
@settings(max_examples=12, deadline=None)
def test_growth_equals_numpy_for_every_kind_of_request(seed: int) -> None:
    kinds: set[str] = set()
    for snapshot, pods, workload in _clusters(seed):
        state = _numpy_state(workload, snapshot)
        rows = np.arange(snapshot.layout.node_count)
        for pod in pods:
            expected = growth_rows(state.tables, snapshot, pod, rows, (state.count[rows], state.usable[rows]),
                                   tuple(state.before[m][rows] for m in MEASURES), MEASURES)  # fmt: skip
            got = kernel.growth(state.tables, snapshot, pod, rows, state.count, state.usable, state.before, MEASURES)
            for want, have in zip(expected, got, strict=True):
                np.testing.assert_array_equal(have, want, err_msg=f"{pod}")
            kinds.add(type(pod.gpu).__name__ + ("+models" if pod.allowed_models else ""))
    assert {"GpuShare", "WholeGpus", "NoneType"} <= kinds


def test_only_the_rows_asked_are_computed_in_their_order() -> None:
    snapshot, pods, workload = next(_clusters(5))
    state = _numpy_state(workload, snapshot)
    everything = kernel.growth(state.tables, snapshot, pods[0], np.arange(snapshot.layout.node_count), state.count,
                               state.usable, state.before, MEASURES)  # fmt: skip
    rows = np.array([7, 2, 19])
    some = kernel.growth(state.tables, snapshot, pods[0], rows, state.count, state.usable, state.before, MEASURES)
    for whole, part in zip(everything, some, strict=True):
        np.testing.assert_array_equal(part, whole[rows])


def test_a_wrong_array_is_an_error_not_a_crash() -> None:
    snapshot, pods, workload = next(_clusters(5))
    state = _numpy_state(workload, snapshot)
    with pytest.raises(IndexError):
        kernel.growth(state.tables, snapshot, pods[0], np.array([snapshot.layout.node_count]), state.count,
                      state.usable, state.before, MEASURES)  # fmt: skip
    with pytest.raises(ValueError):
        kernel.growth(state.tables, snapshot, pods[0], np.array([0]), state.count[:-1], state.usable, state.before,
                      MEASURES)  # fmt: skip


growth_values = st.one_of(st.just(np.inf), st.floats(-5_000, 5_000, allow_nan=False), st.sampled_from([0.0, -0.0]))


@given(st.data(), st.integers(1, 12), st.sampled_from([1, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_best_scores_equal_numpy(data: st.DataObject, rows: int, width: int) -> None:
    growth = np.array(data.draw(st.lists(growth_values, min_size=rows * width, max_size=rows * width)))
    capped = np.array(data.draw(st.lists(st.floats(-3e5, 3e5, allow_nan=False) | st.just(np.inf),
                                         min_size=rows * width, max_size=rows * width)))  # fmt: skip
    shape = (rows, width) if width > 1 else (rows,)
    growth, capped = growth.reshape(shape), capped.reshape(shape)
    policy = FragAwarePolicy(workload_from_requests(_pods(a_mixed_stream(np.random.default_rng(1), 20))))
    want_values, want_gpu = policy._best(growth, capped)
    values, gpu = kernel.best(growth, capped, policy.secondary_step_milli, 1e-6, 1e5)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(gpu, want_gpu)


@given(seed=st.integers(0, 10_000))
@settings(max_examples=12, deadline=None)
def test_the_memory_cost_equals_numpy(seed: int) -> None:
    seen = 0
    for snapshot, pods, workload in _clusters(seed):
        policy = FragAwarePolicy(workload)
        nodes = np.arange(snapshot.layout.node_count)[::2]
        for pod in pods:
            kernel.use(False)
            want = policy._memory_cost(snapshot, pod, nodes)
            kernel.use(True)
            try:
                have = policy._memory_cost(snapshot, pod, nodes)
            finally:
                kernel.use(False)
            if want is None:
                assert have is None
            else:
                seen += 1
                np.testing.assert_array_equal(have, want)
    assert seen


def _decisions(policy_name: str, seed: int, tie_break_seed: int | None, with_kernel: bool, nodes: int = 30):
    """Every decision of one stream (pods with selectors added, gangs, MIG, CPU-only) on a cluster it
    changes, with the kernel's one-call decision or with numpy."""
    kernel.use(with_kernel)
    try:
        rng = np.random.default_rng(seed)
        snapshot = a_mixed_cluster(rng, nodes)
        requests = a_mixed_stream(rng, 200)
        for i, request in enumerate(requests):
            if i % 7 == 3 and not isinstance(request, GangRequest):  # some pods only for one topology block
                requests[i] = dataclasses.replace(request, node_selector=(("gpusched.io/topology-block", "b1"),))
        policy = make_policy(policy_name, workload=workload_from_requests(_pods(requests), popularity=0.9))
        out = []
        for request in requests:
            decision = place(snapshot, request, policy, tie_break_seed=tie_break_seed)
            out.append((decision.placed, decision.bindings, decision.reasons, decision.score))
            if decision.placed:
                snapshot = apply(snapshot, decision)
        return out
    finally:
        kernel.use(False)


@pytest.mark.parametrize("policy_name", ["ours", "fgd"])
@pytest.mark.parametrize("tie_break_seed", [None, 0])
@pytest.mark.parametrize("seed", [2, 9])
def test_one_call_decisions_equal_numpys_with_their_reasons(policy_name: str, tie_break_seed: int | None,
                                                            seed: int) -> None:  # fmt: skip
    with_c = _decisions(policy_name, seed, tie_break_seed, True)
    assert with_c == _decisions(policy_name, seed, tie_break_seed, False)
    assert any("tied, broken by" in " ".join(reasons) for _, _, reasons, _ in with_c)  # ties were settled
    assert any(not placed for placed, *_ in with_c) and any(placed for placed, *_ in with_c)


def test_a_first_use_over_many_nodes_computes_each_kind_of_node_once_and_decides_the_same() -> None:
    assert _decisions("ours", 4, 0, True, nodes=400) == _decisions("ours", 4, 0, False, nodes=400)


def test_nodes_alike_but_for_their_free_cpu_are_told_apart_when_computed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Equal GPUs everywhere, nodes told apart only by their free CPU class before *and* after the request:
    the kernel's one-call decision, computing nodes alike once from the first stale node on, decides as
    numpy does."""
    monkeypatch.setattr(kernel, "DEDUPE_FROM", 0)
    nodes = [Node(NodeId(f"n{i}"), 16_000, 262_144, tuple(Gpu(g, "T4", 16_000) for g in range(4))) for i in range(10)]
    snapshot = build_snapshot(nodes)
    typical = workload_from_requests([PodRequest(RequestId("s"), GpuShare(100), 3_000),
                                      PodRequest(RequestId("w"), WholeGpus(1), 7_000)])  # fmt: skip
    probes = [PodRequest(RequestId("p"), GpuShare(250), 5_000), PodRequest(RequestId("q"), None, 5_000),
              PodRequest(RequestId("r"), WholeGpus(2), 4_000)]  # fmt: skip
    for i in range(70):
        for probe in probes:
            decided = []
            for with_kernel in (True, False):
                kernel.use(with_kernel)
                decision = place(snapshot, probe, make_policy("ours", workload=typical))  # a first use: all stale
                decided.append((decision.bindings, decision.reasons))
            kernel.use(False)
            assert decided[0] == decided[1], (i, probe)
        cpu_only = PodRequest(RequestId(f"c{i}"), None, 500 * (1 + i % 9))
        decision = place(snapshot, cpu_only, make_policy("random", seed=i))
        if decision.placed:
            snapshot = apply(snapshot, decision)


def test_a_workload_beyond_the_kernel_s_tables_is_decided_by_numpy_the_same_way() -> None:
    """300 share sizes make 300 GPU groups, more than the kernel's 256: decisions fall back to numpy (the
    same ones as with the kernel turned off)."""
    shares = [PodRequest(RequestId(f"s{m}"), GpuShare(m), 1_000) for m in range(100, 400)]
    workload = workload_from_requests(shares)
    nodes = [Node(NodeId(f"n{i}"), 64_000, 262_144, tuple(Gpu(g, "T4", 16_000) for g in range(4))) for i in range(6)]
    decided = []
    for with_kernel in (True, False):
        kernel.use(with_kernel)
        try:
            snapshot, policy, out = build_snapshot(nodes), make_policy("ours", workload=workload), []
            for request in shares[::7]:
                decision = place(snapshot, request, policy)
                out.append((decision.bindings, decision.reasons))
                if decision.placed:
                    snapshot = apply(snapshot, decision)
            tables = policy.memo.rows.tables
            assert tables is not None and not kernel.supports(tables)
            decided.append(out)
        finally:
            kernel.use(False)
    assert decided[0] == decided[1]


@given(ratio=st.floats(0.5, 200.0), asked_mib=st.integers(1, 400_000), offsets=st.lists(st.integers(-3, 3), min_size=6,
                                                                                          max_size=6))  # fmt: skip
@settings(max_examples=60, deadline=None)
def test_nodes_at_the_edge_of_the_memory_cost_score_as_numpy_does(ratio: float, asked_mib: int,
                                                                   offsets: list[int]) -> None:  # fmt: skip
    """The kernel tells a node with no memory growth by a multiplication instead of the division: nodes
    whose free memory sits a few MiB either side of what their free GPU milli and the request need at the
    workload's ratio get the same scores and decision as numpy's."""
    milli = 2_000  # two whole GPUs asked
    beyond = max(asked_mib / ratio - milli, 0.0)
    nodes = []
    for i, offset in enumerate(offsets):
        gpus = 4 if i % 2 else 8
        edge = int((gpus * 1_000 + beyond) * ratio)
        nodes.append(Node(NodeId(f"n{i}"), 64_000, max(edge + offset * (1 + i), asked_mib),
                          tuple(Gpu(g, "A100-SXM4-80GB", 80_000) for g in range(gpus))))  # fmt: skip
    request = PodRequest(RequestId("edge"), WholeGpus(2), 1_000, asked_mib)
    workload = dataclasses.replace(workload_from_requests([request]), memory_per_milli=ratio)
    decided = []
    for with_kernel in (True, False):
        kernel.use(with_kernel)
        try:
            decision = place(build_snapshot(nodes), request, FragAwarePolicy(workload))
            decided.append((decision.bindings, decision.reasons, decision.score))
        finally:
            kernel.use(False)
    assert decided[0] == decided[1]


def test_a_decision_call_that_fails_after_stepping_the_node_state_starts_over_the_next_time() -> None:
    """The kernel steps the node state before it reads the rest of a decision's arrays: when a later array is
    wrong the call raises (a clear error, no crash) and every later decision is still numpy's."""
    rng = np.random.default_rng(5)
    snapshot = a_mixed_cluster(rng, 30)
    requests = [r for r in a_mixed_stream(rng, 120) if not isinstance(r, GangRequest)]
    workload = workload_from_requests(_pods(requests), popularity=0.9)
    kernel.use(True)
    try:
        policy, reference = make_policy("ours", workload=workload), make_policy("ours", workload=workload)
        failed = 0
        for i, request in enumerate(requests):
            if i % 10 == 5 and policy.fast(request):  # type: ignore[attr-defined]
                with pytest.raises(ValueError, match="extra"):
                    policy.choose(snapshot, request, np.ones(3, dtype=bool), None)  # type: ignore[attr-defined]
                failed += 1
            decision = place(snapshot, request, policy)
            kernel.use(False)
            want = place(snapshot, request, reference)
            kernel.use(True)
            assert (decision.bindings, decision.reasons) == (want.bindings, want.reasons)
            if decision.placed:
                snapshot = apply(snapshot, decision)
        assert failed
    finally:
        kernel.use(False)


def test_a_first_use_over_more_kinds_of_node_than_the_kept_table_starts_with_decides_as_numpy() -> None:
    """The kernel's table of node kinds starts at 4,096 slots and doubles when half full: 3,000 nodes of 3,000
    kinds (each node's GPUs hold their own mix of shares) make it grow, and the decisions, scores and reasons
    of first uses still equal numpy's, node kind by node kind computed."""
    count = 3_000
    nodes = [Node(NodeId(f"n{i:05d}"), 64_000, 262_144, tuple(Gpu(g, "A100-SXM4-80GB", 80_000) for g in range(8)))
             for i in range(count)]
    bindings = [Binding(NodeId(f"n{i:05d}"), (g,), gpu_milli=100 * ((i >> (2 * g)) & 3))
                for i in range(count) for g in range(8) if (i >> (2 * g)) & 3]
    snapshot = apply_bindings(build_snapshot(nodes), RequestId("background"), bindings)
    typical = workload_from_requests([PodRequest(RequestId("s"), GpuShare(250), 2_000),
                                      PodRequest(RequestId("w"), WholeGpus(1), 4_000)])
    probes = [PodRequest(RequestId("p"), GpuShare(300), 3_000), PodRequest(RequestId("q"), GpuShare(750), 1_000),
              PodRequest(RequestId("r"), WholeGpus(2), 4_000)]
    for probe in probes:
        decided = []
        for with_kernel in (True, False):
            kernel.use(with_kernel)
            try:
                decision = place(snapshot, probe, make_policy("ours", workload=typical))  # a first use: all stale
            finally:
                kernel.use(False)
            decided.append((decision.bindings, decision.reasons, decision.score))
        assert decided[0] == decided[1], probe
