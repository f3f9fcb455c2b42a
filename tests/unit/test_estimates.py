"""Start-time estimates (gpusched_core.estimates): a forward simulation of the queue, scenario by scenario."""

from __future__ import annotations

import pytest

from gpusched_core.estimates import (
    EstimateConfig,
    FinishedRun,
    Hold,
    NodeGpus,
    RunningJob,
    RuntimeModel,
    Shape,
    WaitingJob,
    plan_estimates,
)
from gpusched_core.quota import parse_tenancy

NOW = 10_000.0


def a_node(node_id: str, gpus: int = 8, model: str = "A100") -> NodeGpus:
    return NodeGpus(node_id, model, tuple(range(gpus)))


def running(job_id: str, node_id: str, gpus: int, started: float, limit: float | None = None,
            tenant: str = "t1") -> RunningJob:
    return RunningJob(job_id, tenant, Shape(gpus), started, tuple(Hold(node_id, i) for i in range(gpus)), limit)


def waiting(job_id: str, gpus: int = 1, tenant: str = "t1", limit: float | None = 600.0, nodes: int = 1,
            model: str | None = None, reserved: str | None = None, priority: int = 0, at: float = 0.0) -> WaitingJob:
    return WaitingJob(job_id, tenant, Shape(gpus, nodes, model), at, priority, None, limit, reserved)


def runs(tenant: str, gpus: float, *seconds: float, model: str | None = None) -> list[FinishedRun]:
    return [FinishedRun(tenant, gpus, model, s, NOW - 100) for s in seconds]


def tenancy(t1_nominal: int, t1_borrow: int | None = 0, t2_nominal: int = 0):
    return parse_tenancy({"version": 1, "flavors": ["A100"], "tenants": [{"name": "c", "children": [
        {"name": "t1", "quota": {"A100": {"nominal": t1_nominal, "borrowing_limit": t1_borrow}}},
        {"name": "t2", "quota": {"A100": {"nominal": t2_nominal}}}]}]})


SCENARIOS = [
    # id, nodes, running, waiting, tenancy, expected (job -> wait_s or None)
    ("an_idle_node_starts_the_job_now", [a_node("n1")], [], [waiting("w1", 4)], None, {"w1": 0.0}),
    ("a_full_node_frees_at_the_runs_time_limit", [a_node("n1")], [running("r1", "n1", 8, NOW - 100, 1000)],
     [waiting("w1", 4)], None, {"w1": 900.0}),
    ("jobs_behind_start_as_the_ones_ahead_end", [a_node("n1")], [running("r1", "n1", 8, NOW, 100)],
     [waiting("w1", 8, limit=50), waiting("w2", 8, limit=50)], None, {"w1": 100.0, "w2": 150.0}),
    # placement holds no GPUs back for a big job (as live): the small one behind it starts and delays it
    ("a_small_job_behind_takes_free_gpus_and_delays_a_big_one", [a_node("n1")], [running("r1", "n1", 4, NOW, 100)],
     [waiting("w1", 8), waiting("w2", 2)], None, {"w1": 600.0, "w2": 0.0}),
    ("a_gang_waits_for_two_whole_nodes", [a_node("n1"), a_node("n2")],
     [running("r1", "n1", 8, NOW, 100), running("r2", "n2", 1, NOW, 300)],
     [waiting("w1", 8, nodes=2)], None, {"w1": 300.0}),
    ("a_job_larger_than_every_node_never_starts", [a_node("n1")], [], [waiting("w1", 16)], None, {"w1": None}),
    ("a_model_the_cluster_lacks_never_starts", [a_node("n1")], [], [waiting("w1", 1, model="H100")], None,
     {"w1": None}),
    ("quota_holds_a_tenant_back_while_gpus_are_free", [a_node("n1"), a_node("n2")],
     [running("r1", "n1", 4, NOW, 200)], [waiting("w1", 4)], tenancy(4), {"w1": 200.0}),
    ("a_job_over_its_tenants_limit_never_starts", [a_node("n1")], [], [waiting("w1", 8)], tenancy(4),
     {"w1": None}),
    ("a_tenant_borrows_idle_quota_of_its_cohort", [a_node("n1")], [], [waiting("w1", 8)], tenancy(4, None, 4),
     {"w1": 0.0}),
    ("an_unknown_tenant_never_starts", [a_node("n1")], [], [waiting("w1", 1, tenant="nobody")], tenancy(4),
     {"w1": None}),
    ("placement_order_puts_higher_priority_first_among_jobs_holding_quota", [a_node("n1")],
     [running("r1", "n1", 8, NOW, 100)],
     [waiting("w1", 8, reserved="A100", at=1.0), waiting("w2", 8, reserved="A100", priority=5, at=2.0)], None,
     {"w1": 700.0, "w2": 100.0}),
]


@pytest.mark.parametrize(("nodes", "running_jobs", "queue", "quota", "expected"),
                         [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_estimated_waits(nodes, running_jobs, queue, quota, expected):
    estimates = plan_estimates(nodes, running_jobs, queue, [], NOW, quota)
    assert {e.job_id: e.wait_s for e in estimates} == pytest.approx(expected)
    for e in estimates:
        assert (e.start_s is None) == (e.wait_s is None)
        assert e.start_s is None or e.start_s >= NOW
        assert e.reason


def test_a_job_that_never_fits_says_never_and_one_with_nothing_left_to_end_says_unknown():
    quota = tenancy(4, 0, 4)
    estimates = plan_estimates([a_node("n1")], [], [waiting("w1", 16)], [], NOW, None)
    assert estimates[0].reason.startswith("never")
    stuck = plan_estimates([a_node("n1")], [running("r1", "n1", 8, NOW, 100, tenant="t2")],
                           [waiting("w1", 8)], [], NOW, quota)
    assert stuck[0].wait_s is None and stuck[0].reason.startswith("never")


def test_beyond_the_horizon_is_unknown():
    config = EstimateConfig(horizon_s=50)
    estimates = plan_estimates([a_node("n1")], [running("r1", "n1", 8, NOW, 100)], [waiting("w1", 8)], [], NOW,
                               None, config)
    assert estimates[0].wait_s is None and estimates[0].reason.startswith("unknown")


RUNTIMES = [
    ("a_time_limit_wins", 900.0, runs("t1", 1.0, 10, 20, 30), 900.0, "time limit"),
    ("the_tenants_median_of_its_runs_of_that_shape", None, runs("t1", 1.0, 10, 20, 30, 40), 25.0,
     "tenant median of 4 runs"),
    ("too_few_own_runs_fall_back_to_every_tenants", None, runs("t1", 1.0, 10) + runs("t2", 1.0, 50, 60), 50.0,
     "median of 3 runs of all tenants"),
    ("another_shape_does_not_count", None, runs("t1", 2.0, 10, 20, 30), 3600.0, "default"),
    ("another_model_does_not_count", None, runs("t1", 1.0, 10, 20, 30, model="H100"), 3600.0, "default"),
]


@pytest.mark.parametrize(("limit", "history", "seconds", "source"), [r[1:] for r in RUNTIMES],
                         ids=[r[0] for r in RUNTIMES])
def test_runtime_estimates(limit, history, seconds, source):
    estimate = RuntimeModel.of(history, NOW, EstimateConfig()).estimate("t1", Shape(1), limit)
    assert (estimate.seconds, estimate.source) == (pytest.approx(seconds), source)


def test_runs_outside_the_history_window_are_forgotten():
    old = [FinishedRun("t1", 1.0, None, 10, NOW - 30 * 86400)] * 5
    assert RuntimeModel.of(old, NOW, EstimateConfig()).estimate("t1", Shape(1), None).source == "default"


def test_an_overdue_run_is_given_the_median_of_longer_runs():
    model = RuntimeModel.of(runs("t1", 1.0, 10, 20, 30, 100, 200, 300), NOW, EstimateConfig())
    left = model.remaining("t1", Shape(1), None, elapsed_s=80)
    assert left.seconds == pytest.approx(120) and "longer" in left.source
    assert model.remaining("t1", Shape(1), 40, elapsed_s=50).source == "time limit, overdue"
    assert model.remaining("t1", Shape(1), None, elapsed_s=500).seconds == 500  # longer than all: as long again


def test_a_share_fits_beside_another_share_on_one_gpu():
    share = RunningJob("r1", "t1", Shape(1, share_milli=500), NOW, (Hold("n1", 0, 500),), 100)
    queue = [WaitingJob("w1", "t1", Shape(1, share_milli=500), 0.0, time_limit_s=10),
             WaitingJob("w2", "t1", Shape(1, share_milli=600), 0.0, time_limit_s=10)]
    estimates = plan_estimates([a_node("n1", gpus=1)], [share], queue, [], NOW)
    assert [e.wait_s for e in estimates] == [0.0, 100.0]
