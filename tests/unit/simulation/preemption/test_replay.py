"""The timed replay on hand-made pods (exact numbers), and a short slice of the real openb trace."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from gpusched_core.placement import Gpu, Node, NodeId, PodRequest, RequestId, WholeGpus, make_policy
from gpusched_simulation.preemption.cli import add_simulate_preemption_parser, main
from gpusched_simulation.preemption.engine import simulate
from gpusched_simulation.preemption.metrics import JSON_KEYS
from gpusched_simulation.preemption.state import SimConfig
from gpusched_simulation.preemption.workload import SimPod, demand_quantile_gpus, sample_nodes
from gpusched_simulation.traces.openb import default_nodes_path, default_pods_path, load_nodes

NODE = Node(NodeId("n1"), 64_000, 256_000, tuple(Gpu(i, "A10", 16_000) for i in range(8)))


def pod(pod_id: str, gpus: int, at: float, work: float, qos: str = "BE") -> SimPod:
    priority = 100 if qos == "LS" else 0
    return SimPod(PodRequest(RequestId(pod_id), WholeGpus(gpus)), gpus * 1000, qos, priority, at, work)


def replay(pods, **config):
    return simulate([NODE], pods, make_policy("bestfit"), SimConfig(**config), (0.0, 1e9))


def waits(state) -> dict[str, float]:
    return {pod_id: r.first_start_s - r.pod.created_s for pod_id, r in state.records.items()}


def test_without_preemption_the_high_priority_pod_waits_for_the_low_one():
    state = replay([pod("be", 8, 0, 10_000), pod("ls", 4, 100, 100, "LS")])
    assert waits(state)["ls"] == 9_900
    assert state.preemptions == 0


def test_with_preemption_it_starts_after_the_grace_period_and_the_victim_resumes():
    state = replay([pod("be", 8, 0, 10_000), pod("ls", 4, 100, 100, "LS")], preemption=True, grace_s=30,
                   restore_s=60, checkpoint_interval_s=600)  # fmt: skip
    assert waits(state)["ls"] == 30
    assert state.preemptions == 1
    assert state.lost_gpu_s == 130 * 8  # no checkpoint yet: all 130 s on 8 GPUs are lost
    assert state.records["be"].remaining_s == 0  # it finished after resuming
    assert state.records["be"].preemptions == 1


def test_a_checkpoint_bounds_the_work_lost():
    state = replay([pod("be", 8, 0, 10_000), pod("ls", 4, 1_300, 100, "LS")], preemption=True, grace_s=30,
                   checkpoint_interval_s=600)  # fmt: skip
    assert state.lost_gpu_s == (1_330 - 1_200) * 8


def test_minimum_run_time_delays_preemption_of_a_young_run():
    state = replay([pod("be", 8, 0, 10_000), pod("ls", 4, 10, 100, "LS")], preemption=True, grace_s=30,
                   min_runtime_s=60)  # fmt: skip
    assert waits(state)["ls"] == 60 + 30 - 10


def test_no_preemption_when_the_high_priority_pod_could_not_fit_anyway():
    state = replay([pod("ls1", 8, 0, 1_000, "LS"), pod("be", 1, 0, 1_000), pod("ls2", 8, 5, 10, "LS")],
                   preemption=True)  # fmt: skip
    assert state.preemptions == 0


def test_the_node_sample_keeps_the_mix_of_node_shapes():
    nodes = sample_nodes(load_nodes(default_nodes_path()), 48)
    gpus = sum(len(n.gpus) for n in nodes)
    assert 48 <= gpus <= 56
    assert {n.gpus[0].model for n in nodes} >= {"G2", "T4"}


def test_demand_quantile_weights_by_time():
    pods = [pod("a", 2, 0, 100), pod("b", 6, 90, 10)]
    assert demand_quantile_gpus(pods, (0.0, 100.0), 0.5) == 2
    assert demand_quantile_gpus(pods, (0.0, 100.0), 1.0) == 8


def test_the_subcommand_sets_its_own_func():
    parser = argparse.ArgumentParser()
    add_simulate_preemption_parser(parser.add_subparsers())
    args = parser.parse_args(["simulate-preemption", "--gpus", "16"])
    assert args.func.__name__ == "run_simulate_preemption"


@pytest.fixture(scope="module")
def openb_slice(tmp_path_factory):
    """Pods of openb created in days 137-139 (busy days), as a pod list CSV."""
    path = tmp_path_factory.mktemp("openb") / "slice.csv"
    with open(default_pods_path(), newline="") as source, open(path, "w", newline="") as target:
        reader = csv.DictReader(source)
        writer = csv.DictWriter(target, fieldnames=reader.fieldnames)
        writer.writeheader()
        for row in reader:
            if 137 * 86400 <= int(row["creation_time"]) < 139 * 86400:
                writer.writerow(row)
    return path


def test_a_short_openb_replay_cuts_high_priority_waits_and_writes_the_json(openb_slice, tmp_path, capsys):
    out = tmp_path / "runs.json"
    assert main(["--pods", str(openb_slice), "--gpus", "24", "--json", str(out), "--quiet"]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert list(json.loads(out.read_text())) == ["runs"]
    assert [tuple(run) for run in runs] == [JSON_KEYS, JSON_KEYS]
    off, on = runs
    assert (off["preemption"], on["preemption"]) == (False, True)
    assert off["hp_wait_p99_s"] > 0 and on["hp_wait_p99_s"] <= off["hp_wait_p99_s"] / 5
    assert on["gpu_hours_lost_pct"] < 2.0 and on["preemptions_per_hp_job"] > 0
    assert "HP wait p99 s" in capsys.readouterr().out
