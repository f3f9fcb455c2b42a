"""The what-if replay (gpusched_simulation.whatif): recorded jobs through today's nodes, by policy and tenancy."""

from __future__ import annotations

import pytest

from gpusched_core.quota import parse_tenancy
from gpusched_simulation.whatif.cluster import ReplayNode
from gpusched_simulation.whatif.engine import ReplayJob, replay
from gpusched_simulation.whatif.history import replay_jobs, replay_nodes
from gpusched_simulation.whatif.report import percentile, summarise
from gpusched_simulation.whatif.run import run_all

NODES = [ReplayNode("n1", "A100", 8), ReplayNode("n2", "A100", 8)]


def a_job(job_id: str, tenant: str = "t1", gpus: int = 8, submit: float = 0.0, runtime: float = 100.0,
          model: str | None = None, priority: int = 0) -> ReplayJob:
    return ReplayJob(job_id, tenant, gpus, model, priority, submit, runtime)


def tenancy(t2_nominal: float):
    return parse_tenancy({"version": 1, "flavors": ["A100"], "tenants": [{"name": "c", "children": [
        {"name": "t1", "quota": {"A100": {"nominal": 16}}},
        {"name": "t2", "quota": {"A100": {"nominal": t2_nominal, "borrowing_limit": 0}}}]}]})


SCENARIOS = [
    # id, jobs, tenancy, expected waits
    ("jobs_that_fit_start_on_arrival", [a_job("a"), a_job("b")], None, {"a": 0, "b": 0}),
    ("a_third_full_node_job_waits_for_the_first_end", [a_job("a"), a_job("b"), a_job("c", submit=10)], None,
     {"a": 0, "b": 0, "c": 90}),
    ("a_gang_of_two_nodes_waits_for_both", [a_job("a", gpus=4), a_job("g", gpus=16, submit=1)], None,
     {"a": 0, "g": 99}),
    ("priority_goes_first_among_waiting_jobs", [a_job("a", gpus=16), a_job("lo", gpus=16, submit=1),
                                                a_job("hi", gpus=16, submit=2, priority=9)], None,
     {"a": 0, "lo": 199, "hi": 98}),
    ("quota_holds_a_tenant_back_while_gpus_are_free", [a_job("a", "t2"), a_job("b", "t2", submit=1)], tenancy(8),
     {"a": 0, "b": 99}),
]


@pytest.mark.parametrize(("jobs", "quota", "waits"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_replayed_waits(jobs, quota, waits):
    state = replay(jobs, NODES, "bestfit", quota)
    assert {k: o.wait_s for k, o in state.outcomes.items()} == pytest.approx(waits)
    assert state.cluster.allocated == 0 and state.max_overshoot_units <= 0


def test_jobs_that_can_never_run_here_are_reported_unschedulable():
    jobs = [a_job("big", gpus=32), a_job("h100", gpus=1, model="H100"), a_job("none", "t2", gpus=1)]
    figures = summarise(replay(jobs, NODES, "bestfit", tenancy(0)))
    assert figures["replayed"] == 0 and {u["job_id"] for u in figures["unschedulable"]} == {"big", "h100", "none"}
    assert figures["tenants"]["t2"]["unschedulable"] == 1


def test_the_figures_of_a_run():
    figures = summarise(replay([a_job("a"), a_job("b", "t2", submit=100)], NODES, "bestfit"))
    assert (figures["jobs"], figures["replayed"], figures["avg_jct_s"]) == (2, 2, 100)
    assert figures["gpu_allocation_pct"] == pytest.approx(100 * 8 * 200 / (16 * 200))
    assert figures["fragmentation_pct"] >= 0 and figures["preemptions"] == 0
    assert set(figures["tenants"]) == {"t1", "t2"} and figures["tenants"]["t2"]["avg_wait_s"] == 0


def test_every_policy_and_tenancy_is_a_run_and_an_unknown_policy_is_refused():
    lines = []
    results = run_all([a_job("a"), a_job("b", "t2")], NODES, ["bestfit", "ours"], {"x.yaml": tenancy(8), "": None},
                      lines.append)
    assert list(results) == ["bestfit@x.yaml", "ours@x.yaml", "bestfit", "ours"] and len(lines) == 4
    with pytest.raises(ValueError, match="unknown policies"):
        run_all([], NODES, ["nope"], {"": None}, lines.append)


def test_history_rows_become_jobs_and_nodes():
    rows = [{"job_id": "j1", "tenant": "a", "gpus": 2, "gpu_model": None, "priority": 0,
             "submitted_at": "2026-01-01T00:00:00Z", "started_at": "2026-01-01T00:00:10Z",
             "finished_at": "2026-01-01T00:01:10Z"},
            {"job_id": "j2", "tenant": "a", "gpus": 1, "submitted_at": "2026-01-01T00:00:00Z", "started_at": None,
             "finished_at": None}]
    jobs, skipped = replay_jobs(rows)
    assert skipped == 1 and [(j.job_id, j.gpus, j.runtime_s) for j in jobs] == [("j1", 2, 60.0)]
    nodes = replay_nodes([{"node_id": "n1", "status": "Ready", "gpus_by_model": {"A100": {"total": 4, "free": 1}}},
                          {"node_id": "n2", "status": "Lost", "gpus_by_model": {"A100": {"total": 4, "free": 4}}}])
    assert nodes == [ReplayNode("n1", "A100", 4)]


def test_percentile_is_nearest_rank():
    assert percentile([], 99) is None and percentile([1, 2, 3, 4], 50) == 2 and percentile(range(100), 99) == 98
