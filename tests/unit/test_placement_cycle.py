from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.placement import engine
from services.placement.core import PendingJob
from services.placement.cycle import GpuRow, NodeRow, build_cluster, plan_cycle


def a_node(node_id: str, gpus: int = 8, model: str = "H100-80GB", unhealthy: tuple[int, ...] = ()) -> NodeRow:
    return NodeRow(node_id, 64_000, 512_000, tuple(
        GpuRow(i, f"{node_id}-u{i}", model, 81559, i not in unhealthy) for i in range(gpus)), {})


def job(job_id: str, gpus: int, model: str | None = None, priority: int = 0, seq: int = 0) -> PendingJob:
    return PendingJob(job_id, gpus, model, priority, seq)


@pytest.fixture(scope="module")
def bestfit():
    return engine.make_policy("bestfit")


def test_bestfit_fills_the_fuller_node_first(bestfit):
    nodes = [a_node("n1"), a_node("n2")]
    snapshot = build_cluster(nodes, {"old": [("n2", i) for i in range(6)]}, {})
    placements, deferrals = plan_cycle(snapshot, [job("j", 2)], bestfit, nodes)
    assert deferrals == [] and placements[0].node_id == "n2"
    assert placements[0].gpu_indices == (6, 7) and placements[0].gpu_uuids == ("n2-u6", "n2-u7")


def test_a_cycle_never_gives_a_gpu_twice_and_defers_with_reasons_per_class(bestfit):
    nodes = [a_node("n1", gpus=4), a_node("n2", gpus=4, model="A100-80GB")]
    snapshot = build_cluster(nodes, {}, {})
    placements, deferrals = plan_cycle(snapshot, [job("a", 4, "H100-80GB", seq=1), job("b", 2, "H100-80GB", seq=2)],
                                       bestfit, nodes)
    assert [p.job_id for p in placements] == ["a"]
    assert deferrals[0].job_id == "b" and deferrals[0].reasons  # why, per class of node


def test_unhealthy_gpus_are_not_used(bestfit):
    nodes = [a_node("n1", gpus=2, unhealthy=(0,))]
    placements, _ = plan_cycle(build_cluster(nodes, {}, {}), [job("j", 1)], bestfit, nodes)
    assert placements[0].gpu_indices == (1,)


def test_nominated_gpus_go_to_their_preemptor_only(bestfit):
    nodes = [a_node("n1", gpus=2)]
    snapshot = build_cluster(nodes, {}, {"hp": [("n1", 0), ("n1", 1)]})
    placements, deferrals = plan_cycle(snapshot, [job("small", 1, priority=5, seq=1), job("hp", 2, seq=2)],
                                       bestfit, nodes)
    assert [p.job_id for p in placements] == ["hp"]
    assert [d.job_id for d in deferrals] == ["small"]


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2)), max_size=25), st.integers(1, 3))
def test_cycles_are_deterministic_and_within_capacity(jobs, node_count):
    policy = engine.make_policy("bestfit")
    nodes = [a_node(f"n{i}") for i in range(node_count)]
    work = [job(f"j{i}", g, None, p, i) for i, (g, p) in enumerate(jobs)]
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), work, policy, nodes)
    used = [(p.node_id, i) for p in placements for i in p.gpu_indices]
    assert len(used) == len(set(used)) and len(placements) + len(deferrals) == len(work)
    assert plan_cycle(build_cluster(nodes, {}, {}), list(reversed(work)), policy, nodes) == (placements, deferrals)
