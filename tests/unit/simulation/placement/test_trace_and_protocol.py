"""Loading openb CSVs and the published replay protocol (shuffle, inflation, checkpoints)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpusched_core.placement import GpuShare, WholeGpus, workload_from_requests
from gpusched_simulation.placement.metrics import allocated_pct_at, unallocated_pct
from gpusched_simulation.placement.published import published_unallocated
from gpusched_simulation.placement.replay import arrival_order, replay
from gpusched_simulation.traces.openb import default_nodes_path, default_pods_path, load_nodes, load_pods


def test_nodes_and_pods_load_as_engine_values(tiny_trace: tuple[Path, Path, Path]) -> None:
    nodes_path, pods_path, _ = tiny_trace
    nodes = load_nodes(nodes_path)
    assert [n.id for n in nodes] == ["node-a", "node-b", "node-c", "node-d"]
    assert len(nodes[2].gpus) == 8 and nodes[2].gpus[0].model == "G2" and nodes[3].gpus == ()
    pods = load_pods(pods_path)
    assert [p.request.id for p in pods] == sorted(p.request.id for p in pods)
    by_id = {p.request.id: p for p in pods}
    assert by_id["pod-000"].request.gpu == GpuShare(500) and by_id["pod-000"].gpu_milli == 500
    assert by_id["pod-001"].request.gpu == WholeGpus(1)
    assert by_id["pod-002"].request.gpu is None and by_id["pod-002"].gpu_milli == 0
    assert by_id["pod-003"].request.allowed_models == frozenset({"T4"}) and by_id["pod-003"].gpu_milli == 2000
    assert by_id["pod-004"].request.allowed_models == frozenset({"G2", "T4"})


def test_arrivals_are_a_seeded_shuffle_then_inflation_up_to_130_percent(tiny_trace) -> None:  # noqa: ANN001
    _, pods_path, _ = tiny_trace
    pods = load_pods(pods_path)
    capacity = 20_000  # the 30 pods ask for 22 500 milli: inflation adds up to 26 000
    order = arrival_order(pods, capacity, seed=42)
    assert sorted(p.request.id for p in order[: len(pods)]) == sorted(p.request.id for p in pods)
    assert all("-tuned-" in p.request.id for p in order[len(pods):])
    assert sum(p.gpu_milli for p in order) <= 1.3 * capacity
    assert [p.request.id for p in arrival_order(pods, capacity, seed=42)] == [p.request.id for p in order]
    assert [p.request.id for p in arrival_order(pods, capacity, seed=43)] != [p.request.id for p in order]


def test_a_pod_list_above_the_target_loses_random_pods(tiny_trace) -> None:  # noqa: ANN001
    pods = load_pods(tiny_trace[1])
    order = arrival_order(pods, 10_000, seed=42)
    assert sum(p.gpu_milli for p in order) <= 13_000
    assert not any("-tuned-" in p.request.id for p in order)


def test_checkpoints_average_the_pods_whose_arrival_rounds_to_them() -> None:
    capacity = 1000
    arrived = np.array([490, 500, 504, 995, 1000, 1004])
    allocated = np.array([400, 410, 420, 900, 900, 910])
    assert allocated_pct_at(arrived, allocated, capacity, 50) == pytest.approx(41.5)  # 50.0% and 50.4%
    assert allocated_pct_at(arrived, allocated, capacity, 51) == pytest.approx(41.5)  # falls back to 50..52
    assert allocated_pct_at(arrived, allocated, capacity, 70) is None
    assert unallocated_pct(arrived, allocated, capacity, (100,)) == {"100": pytest.approx(9.67)}


def test_published_figures_are_the_median_and_range_of_unallocated_gpu(tiny_trace) -> None:  # noqa: ANN001
    _, _, published = tiny_trace
    figure = published_unallocated(published, "tiny_pods", "05-BestFit")
    assert figure is not None and (figure.median, figure.low, figure.high) == (8.0, 7.0, 9.0)
    assert published_unallocated(published, "tiny_pods", "01-Random") is None


@pytest.mark.parametrize("policy", ["random", "bestfit", "fgd", "ours"])
def test_a_replay_is_reproducible_and_accounts_for_every_pod(tiny_trace, policy: str) -> None:  # noqa: ANN001
    nodes_path, pods_path, _ = tiny_trace
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    workload = workload_from_requests(p.request for p in pods)
    first = replay(nodes, pods, policy, 42, workload)
    second = replay(nodes, pods, policy, 42, workload)
    assert first.placed + first.failed == len(first.arrived_milli)
    assert np.array_equal(first.allocated_milli, second.allocated_milli)
    assert (first.allocated_milli <= first.arrived_milli).all()
    assert first.allocated_milli[-1] <= first.capacity_milli


@pytest.mark.skipif(not default_pods_path().is_file(), reason="shared openb traces not present")
def test_a_sample_of_the_real_trace_replays_with_bestfit_and_fgd() -> None:
    nodes = load_nodes(default_nodes_path())[::20]  # 61 of 1213 nodes
    pods = load_pods(default_pods_path())[::20]  # 408 of 8152 pods
    workload = workload_from_requests(p.request for p in pods)
    for policy in ("bestfit", "fgd"):
        log = replay(nodes, pods, policy, 42, workload)
        unallocated = unallocated_pct(log.arrived_milli, log.allocated_milli, log.capacity_milli)
        assert 0.0 <= unallocated["100"] < 60.0
        assert set(log.fragmentation_pct) == {50, 90, 100}
