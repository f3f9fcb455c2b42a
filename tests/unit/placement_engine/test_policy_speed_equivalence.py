"""The memoised FGD and ``ours`` choose what a plain computation from the definitions chooses.

The reference below recomputes every node's fragmentation before and after, shape by shape in plain
Python, on every decision; it keeps nothing between decisions, so it cannot go stale. The policies under
test keep one memo across a few hundred decisions on a cluster that changes under them in every way a
snapshot can: placements (shares with and without GPU memory, whole GPUs, gangs on scratch copies,
CPU-only, model-pinned, MIG), releases, GPUs going unhealthy, and decisions on older snapshots (a what-if
copy). Growth is compared after the rounding to a millionth of a milli that both sides apply.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pytest

from gpusched_core.placement import (
    ClusterSnapshot,
    GangRequest,
    Gpu,
    GpuShare,
    MigSlice,
    Node,
    NodeId,
    PodRequest,
    RequestId,
    WholeGpus,
    WorkloadDistribution,
    apply,
    build_snapshot,
    make_policy,
    place,
    rebuild,
    release,
    with_gpu_state,
    workload_from_requests,
)
from gpusched_core.placement import frag_memo, growth, kernel
from gpusched_core.placement.fgd import FragmentationMemo, frag_growth, sigmoid_score
from gpusched_core.placement.fragmentation import shape_arrays
from gpusched_core.placement.policies import Candidates, NodeScores, mig_packing_scores
from gpusched_core.placement.scarcity import NodeClasses, class_pressure, scarcity_cost

MODELS = ("A100-80GB", "T4", "V100M32", "A10")

# --- the reference: fragmentation from its definition, node by node ------------------------------------


def _fragmentation(free: tuple[int, ...], models: tuple[str | None, ...], cpu: int,
                   workload: WorkloadDistribution, measure: str) -> float:  # fmt: skip
    """free(node) - sum_t p_t * usable_t(node) over the workload's GPU shapes (fragmentation's module doc)."""
    usable = 0.0
    for shape, weight in zip(workload.shapes, workload.weights, strict=True):
        if shape.gpu_count == 0:
            continue
        hosts = [g for g, milli in enumerate(free) if milli >= shape.gpu_milli
                 and (not shape.allowed_models or models[g] in shape.allowed_models)]  # fmt: skip
        if cpu < shape.cpu_milli or len(hosts) < shape.gpu_count:
            continue
        milli = sum(free[g] for g in hosts)
        if measure == "capped" and shape.cpu_milli > 0:
            milli = min(milli, cpu // shape.cpu_milli * shape.gpu_milli * shape.gpu_count)
        usable += weight * milli
    return sum(free) - usable


def reference_growth(snapshot: ClusterSnapshot, request: PodRequest, workload: WorkloadDistribution,
                     measure: str, nodes: np.ndarray) -> np.ndarray:  # fmt: skip
    """(len(nodes), gpus) growth of each node's fragmentation if ``request`` goes there (column g: a
    share on GPU g, +inf where it does not fit; every column alike otherwise)."""
    layout, gpu = snapshot.layout, request.gpu
    out = np.full((nodes.size, layout.max_gpus), np.inf)
    for i, row in enumerate(nodes.tolist()):
        present = layout.gpu_present[row]
        models = tuple(layout.models[m] if p else None for m, p in zip(layout.gpu_model[row], present, strict=True))
        allowed = [p and (not request.allowed_models or m in request.allowed_models) for m, p in zip(models, present)]
        free, cpu = tuple(int(x) for x in snapshot.share_free[row]), int(snapshot.cpu_free[row])
        before = _fragmentation(free, models, cpu, workload, measure)
        after_cpu = cpu - request.cpu_milli
        if isinstance(gpu, GpuShare):
            for g, milli in enumerate(free):
                fits = (milli if allowed[g] or not request.allowed_models else 0) >= gpu.milli
                if fits and snapshot.gpu_memory_free[row, g] >= gpu.memory_mib:
                    left = free[:g] + (milli - gpu.milli,) + free[g + 1:]
                    out[i, g] = round(_fragmentation(left, models, after_cpu, workload, measure) - before, 6) + 0.0
            continue
        left = free
        if isinstance(gpu, WholeGpus):
            full = [g for g, milli in enumerate(free) if milli == 1000 and (allowed[g] or not request.allowed_models)]
            taken = set(full[: gpu.count])
            left = tuple(0 if g in taken else milli for g, milli in enumerate(free))
        out[i, :] = round(_fragmentation(left, models, after_cpu, workload, measure) - before, 6) + 0.0
    return out


@dataclass(eq=False)
class ReferencePolicy:
    """FGD (``fgd``, ``fgd-exact``) or ``ours`` scored in full on every decision, from the definitions."""

    name: str
    workload: WorkloadDistribution
    typical: WorkloadDistribution = field(init=False)

    def __post_init__(self) -> None:
        self.typical = self.workload.most_popular(0.9 if self.name == "ours" else 0.95)

    def score(self, candidates: Candidates) -> NodeScores:
        snapshot, request, nodes = candidates.snapshot, candidates.request, candidates.nodes
        if isinstance(request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        grow = reference_growth(snapshot, request, self.typical, "fgd", nodes)
        if self.name == "fgd-exact":
            return _best(np.where(np.isinf(grow), -np.inf, -grow), request, "-(fragmentation growth, milli)")
        if self.name == "fgd":
            return _best(np.where(np.isinf(grow), -np.inf, sigmoid_score(grow)), request, "FGD score")
        classes = NodeClasses.of(snapshot.layout)
        pressure = class_pressure(self.workload, classes)
        if pressure.any():
            grow = grow + 2.0 * scarcity_cost(pressure, classes, snapshot, request, nodes)
        grow = grow + 2.0 * memory_growth(snapshot, request, self.workload.memory_per_milli, nodes)[:, None]
        capped = reference_growth(snapshot, request, self.typical, "capped", nodes)
        secondary = np.floor(np.clip(np.where(np.isinf(capped), 0.0, capped), -1e5, 1e5) / 250.0)
        per_gpu = np.where(np.isinf(grow), -np.inf, sigmoid_score(grow) - 1e-6 * secondary)
        return _best(per_gpu, request, "FGD score - 1e-6 x CPU-capped fragmentation growth (quarter GPUs)")


def memory_growth(snapshot: ClusterSnapshot, request: PodRequest, ratio: float | None, nodes: np.ndarray) -> np.ndarray:
    """Per node: how much more of its free GPU milli its free memory could not serve at ``ratio`` MiB per
    milli once ``request`` is there, node by node."""
    out = np.zeros(len(nodes))
    if ratio is None:
        return out
    for i, row in enumerate(nodes):
        gpu = float(snapshot.share_free_total[row])
        memory = float(snapshot.memory_free[row])
        before = max(gpu - memory / ratio, 0.0)
        after = max(gpu - request.gpu_milli_total - (memory - request.memory_mib) / ratio, 0.0)
        out[i] = after - before
    return out


def _best(per_gpu: np.ndarray, request: PodRequest, meaning: str) -> NodeScores:
    best_gpu = per_gpu.argmax(axis=1)  # first GPU among equals
    share = best_gpu if isinstance(request.gpu, GpuShare) else None
    return NodeScores(per_gpu[np.arange(best_gpu.size), best_gpu], share, meaning=meaning)


# --- a cluster that changes in every way -----------------------------------------------------------------


def a_mixed_cluster(rng: np.random.Generator, count: int) -> ClusterSnapshot:
    nodes = []
    for i in range(count):
        model = MODELS[int(rng.integers(len(MODELS)))]
        gpus = int(rng.choice([0, 1, 2, 4, 8, 8]))
        mig = model.startswith("A100") and rng.random() < 0.5
        nodes.append(Node(NodeId(f"n{i:02d}"), int(rng.choice([24_000, 48_000, 96_000])), 262_144, tuple(
            Gpu(g, model, 40_000, healthy=rng.random() > 0.05, nvlink_domain=g // 4 if gpus == 8 else None,
                mig_enabled=mig and g % 2 == 0) for g in range(gpus)),
            {"gpusched.io/topology-block": f"b{i % 3}"}))  # fmt: skip
    return build_snapshot(nodes)


def a_mixed_stream(rng: np.random.Generator, count: int) -> list[PodRequest | GangRequest]:
    requests: list[PodRequest | GangRequest] = []
    for i in range(count):
        kind, cpu = rng.random(), int(rng.choice([0, 1_000, 2_000, 4_000, 8_000, 64_000]))  # 64 CPUs: big nodes only
        models = frozenset(rng.choice(MODELS, size=int(rng.integers(1, 3)), replace=False).tolist()) \
            if rng.random() < 0.25 else frozenset()  # fmt: skip
        rid = RequestId(f"r{i}")
        if kind < 0.35:
            share = GpuShare(int(rng.choice([100, 250, 500, 700])), int(rng.choice([0, 0, 8_000, 30_000])))
            requests.append(PodRequest(rid, share, cpu, int(rng.choice([1024, 1024, 40_000])), models))
        elif kind < 0.65:
            count = int(rng.choice([1, 1, 2, 4, 8]))
            memory = count * int(rng.choice([2048, 30_000, 30_000, 60_000]))  # up to 60 GiB a GPU: memory binds
            requests.append(PodRequest(rid, WholeGpus(count), cpu, memory, models))
        elif kind < 0.75:
            requests.append(PodRequest(rid, None, cpu, int(rng.choice([512, 512, 20_000]))))
        elif kind < 0.87:
            requests.append(PodRequest(rid, MigSlice(str(rng.choice(["1g.10gb", "3g.40gb"]))), cpu, 512))
        else:
            requests.append(GangRequest(rid, int(rng.integers(2, 4)), int(rng.choice([1, 2])), cpu, 1024, models))
    return requests


def _regear(nodes: tuple[Node, ...], rng: np.random.Generator) -> list[Node]:
    """The nodes, one of them replaced by a node with GPUs of another model."""
    chosen = int(rng.integers(len(nodes)))
    node = nodes[chosen]
    gpus = tuple(Gpu(g.index, "T4" if g.model != "T4" else "A10", g.memory_mib, g.uuid, g.healthy, g.nvlink_domain)
                 for g in node.gpus)  # fmt: skip
    return [*nodes[:chosen], Node(NodeId(f"{node.id}-new"), node.cpu_milli, node.memory_mib, gpus, node.labels),
            *nodes[chosen + 1:]]  # fmt: skip


def _pods(requests: list[PodRequest | GangRequest]) -> list[PodRequest]:
    return [r.member(0) if isinstance(r, GangRequest) else r for r in requests]


def _pinned_heavy(requests: list[PodRequest | GangRequest]) -> WorkloadDistribution:
    """The stream's own workload, with pinned shapes weighted up so that scarcity costs come due."""
    pods = _pods(requests)
    pinned = [p for p in pods if p.allowed_models and p.gpu is not None]
    return workload_from_requests(pods + pinned * 6)


def _decide(snapshot: ClusterSnapshot, request: PodRequest | GangRequest, policy: object, seed: int | None):
    return place(snapshot, request, policy, tie_break_seed=seed)  # type: ignore[arg-type]


def test_the_mixed_stream_presses_on_node_classes_by_size_as_well_as_by_model() -> None:
    """So that the comparison below covers scarcity costs of both kinds."""
    rng = np.random.default_rng(3)
    snapshot = a_mixed_cluster(rng, 36)
    pods = [p for p in _pods(a_mixed_stream(rng, 260)) if p.gpu is not None and not p.allowed_models]
    classes = NodeClasses.of(snapshot.layout)
    assert class_pressure(workload_from_requests(pods), classes).any()  # no pinned pod among them


def test_the_mixed_stream_asks_memory_that_strands_gpus() -> None:
    """So that the comparison below covers the memory cost too."""
    rng = np.random.default_rng(3)
    snapshot = a_mixed_cluster(rng, 36)
    pods = [p for p in _pods(a_mixed_stream(rng, 260)) if p.gpu is not None]
    ratio = workload_from_requests(pods).memory_per_milli
    nodes = np.arange(len(snapshot.nodes))
    assert any(memory_growth(snapshot, pod, ratio, nodes).any() for pod in pods)


@pytest.fixture(params=["C kernel", "C kernel, dedupe always", "numpy", "numpy, dedupe always"])
def dedupe(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run with the C kernel (as shipped), with numpy, and with each computing equal node states and GPUs
    always once."""
    if request.param.startswith("C kernel"):
        assert kernel.built(), "the placement kernel is not built: `make install` needs a C compiler (gcc)"
        monkeypatch.setattr(kernel, "ENABLED", True)
    else:
        monkeypatch.setattr(kernel, "ENABLED", False)
    if request.param == "C kernel, dedupe always":
        monkeypatch.setattr(kernel, "DEDUPE_FROM", 0)
    if request.param == "numpy, dedupe always":
        monkeypatch.setattr(frag_memo, "_DEDUPE_FROM", 1)
        monkeypatch.setattr(growth, "_DEDUPE_PAIRS_FROM", 1)


@pytest.mark.usefixtures("dedupe")
@pytest.mark.parametrize("policy_name", ["ours", "fgd", "fgd-exact"])
@pytest.mark.parametrize("seed", [3, 8])
def test_memoised_policies_choose_as_the_full_computation_over_a_changing_cluster(policy_name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    snapshot = a_mixed_cluster(rng, 36)
    stream = a_mixed_stream(rng, 260)
    workload = _pinned_heavy(stream)
    fast, slow = make_policy(policy_name, workload=workload), ReferencePolicy(policy_name, workload)
    tie_seed = seed if seed % 2 else None
    live: list[RequestId] = []
    older = snapshot
    for i, request in enumerate(stream):
        on_older = rng.random() < 0.08  # a what-if on an older snapshot, not applied
        base = older if on_older else snapshot
        decision = _decide(base, request, fast, tie_seed)
        expected = _decide(base, request, slow, tie_seed)
        assert (decision.placed, decision.bindings, decision.score, decision.reasons) == (
            expected.placed, expected.bindings, expected.score, expected.reasons), f"decision {i}: {request}"
        if on_older:
            continue
        older = snapshot if rng.random() < 0.3 else older
        if decision.placed:
            snapshot = apply(snapshot, decision)
            live.append(decision.request_id)
        if live and rng.random() < 0.25:
            snapshot = release(snapshot, live.pop(int(rng.integers(len(live)))))
        if i % 37 == 0:
            node = snapshot.nodes[int(rng.integers(len(snapshot.nodes)))]
            if node.gpus:
                snapshot = with_gpu_state(snapshot, node.id, len(node.gpus) - 1, healthy=bool(rng.random() < 0.5))
        if i % 53 == 52:  # loaded again from the store: the same nodes, or one of them with new GPUs
            snapshot = rebuild(snapshot, snapshot.nodes if i % 106 == 52 else _regear(snapshot.nodes, rng))
            live = [a for a in live if a in snapshot.allocations]  # those on the new node are gone


@pytest.mark.usefixtures("dedupe")
def test_the_memo_of_both_measures_equals_the_reference_growth_on_every_node() -> None:
    rng = np.random.default_rng(5)
    snapshot = a_mixed_cluster(rng, 30)
    stream = _pods(a_mixed_stream(rng, 160))
    workload = _pinned_heavy(stream).most_popular(0.95)
    memo = FragmentationMemo(workload, ("fgd", "capped"))
    shapes = shape_arrays(workload, snapshot.layout)
    everyone = np.arange(snapshot.layout.node_count)
    chooser = make_policy("bestfit")
    for request in stream:
        if isinstance(request.gpu, MigSlice):
            continue
        for measure in ("fgd", "capped"):
            fresh = frag_growth(snapshot, request, shapes, everyone, measure)
            assert np.array_equal(memo.growth(snapshot, request, measure), fresh)
            assert np.array_equal(fresh, reference_growth(snapshot, request, workload, measure, everyone))
        decision = place(snapshot, request, chooser)
        if decision.placed:
            snapshot = apply(snapshot, decision)


def test_a_node_that_changes_between_two_uses_of_a_shape_is_recomputed() -> None:
    rng = np.random.default_rng(11)
    snapshot = a_mixed_cluster(rng, 12)
    typical = _pinned_heavy(a_mixed_stream(rng, 80)).most_popular(0.95)
    memo = FragmentationMemo(typical, ("fgd", "capped"))
    probe = PodRequest(RequestId("probe"), GpuShare(250), 2_000)
    shapes, everyone = shape_arrays(typical, snapshot.layout), np.arange(snapshot.layout.node_count)
    first = memo.growth(snapshot, probe).copy()
    taken = place(snapshot, PodRequest(RequestId("w"), WholeGpus(1), 4_000), make_policy("bestfit"))
    assert taken.placed
    changed = apply(snapshot, taken)
    row = changed.node_index(taken.bindings[0].node_id)
    again = memo.growth(changed, probe)
    assert np.array_equal(again, frag_growth(changed, probe, shapes, everyone))
    assert not np.array_equal(again[row], first[row])  # the taken GPU can no longer host the probe
    assert np.array_equal(memo.growth(snapshot, probe), first)  # and back on the older snapshot


@pytest.mark.usefixtures("dedupe")
def test_nodes_alike_but_for_their_free_cpu_are_told_apart() -> None:
    """Equal GPUs everywhere: only the free CPU (its class before *and* after) tells the nodes apart."""
    nodes = [Node(NodeId(f"n{i}"), 16_000, 262_144, tuple(Gpu(g, "T4", 16_000) for g in range(4))) for i in range(10)]
    snapshot = build_snapshot(nodes)
    typical = workload_from_requests([PodRequest(RequestId("s"), GpuShare(100), 3_000),
                                      PodRequest(RequestId("w"), WholeGpus(1), 7_000)])  # fmt: skip
    kept = FragmentationMemo(typical, ("fgd", "capped"))
    shapes, everyone = shape_arrays(typical, snapshot.layout), np.arange(len(nodes))
    probes = [PodRequest(RequestId("p"), GpuShare(250), 5_000), PodRequest(RequestId("q"), None, 5_000)]
    for i in range(70):
        fresh = FragmentationMemo(typical, ("fgd", "capped"))  # every node at once, in many CPU states
        for memo, probe, measure in itertools.product((kept, fresh), probes, ("fgd", "capped")):
            expected = frag_growth(snapshot, probe, shapes, everyone, measure)
            assert np.array_equal(memo.growth(snapshot, probe, measure), expected), (i, probe, measure)
        cpu_only = PodRequest(RequestId(f"c{i}"), None, 500 * (1 + i % 9))
        decision = place(snapshot, cpu_only, make_policy("random", seed=i))
        if decision.placed:
            snapshot = apply(snapshot, decision)


def test_a_snapshot_loaded_again_over_the_same_gpus_keeps_the_memo() -> None:
    rng = np.random.default_rng(2)
    snapshot = a_mixed_cluster(rng, 16)
    policy = make_policy("ours", workload=_pinned_heavy(a_mixed_stream(rng, 60)))
    probe = PodRequest(RequestId("probe"), GpuShare(250), 2_000)
    place(snapshot, probe, policy)
    rows = policy.memo.rows  # type: ignore[attr-defined]
    clock = rows.clock
    again = rebuild(snapshot, [Node(n.id, n.cpu_milli, n.memory_mib, n.gpus, n.labels) for n in snapshot.nodes])
    assert again.layout is not snapshot.layout
    reference = ReferencePolicy("ours", policy.workload)  # type: ignore[attr-defined]
    assert place(again, probe, policy) == place(again, probe, reference)
    assert rows.clock == clock  # nothing to recompute: the same GPUs, the same free capacity
