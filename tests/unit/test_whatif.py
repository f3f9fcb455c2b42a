"""The what-if replay (gpusched_core.whatif, re-exported by gpusched_simulation.whatif): recorded jobs through
today's nodes, by policy and tenancy; a higher-priority job preempts through the live victim selection."""

from __future__ import annotations

import pytest

from gpusched_core.quota import parse_tenancy
from gpusched_simulation.whatif.cluster import ReplayNode
from gpusched_core.whatif import PreemptionSettings
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


# --- preemption -------------------------------------------------------------------------------------------

LOW_TWO = [a_job("lo1", runtime=1000), a_job("lo2", submit=30, runtime=1000)]  # both nodes, priority 0


@pytest.mark.parametrize("quota", [None, tenancy(8)], ids=["no-tenancy", "tenancy"])
def test_a_higher_priority_job_preempts_the_run_that_loses_least_and_the_victim_runs_again(quota):
    """hi arrives at 100 with both nodes busy: lo2 (younger: less work lost) is stopped after the 30 s grace,
    hi starts then on its node; lo2 queues again and reruns from scratch once hi ends."""
    jobs = [*LOW_TWO, a_job("hi", "t2" if quota else "t1", submit=100, runtime=100, priority=9)]
    state = replay(jobs, NODES, "bestfit", quota)
    hi, lo1, lo2 = state.outcomes["hi"], state.outcomes["lo1"], state.outcomes["lo2"]
    assert (hi.start_s, hi.end_s) == (130, 230)
    assert (lo2.preempted, lo2.start_s, lo2.end_s) == (1, 30, 230 + 1000)
    assert lo2.lost_gpu_s == 8 * (130 - 30) and lo1.preempted == 0 and lo1.end_s == 1000
    figures = summarise(state)
    assert figures["preemptions"] == 1 and figures["lost_gpu_hours"] == pytest.approx(8 * 100 / 3600)
    assert figures["tenants"]["t1"]["preempted"] == 1 and figures["replayed"] == 3
    assert state.cluster.allocated == 0 and not state.running


def test_a_run_younger_than_the_minimum_run_time_is_protected():
    """At 70, lo2 has run 40 s (< 60 s): lo1 is the victim although it loses more."""
    state = replay([*LOW_TWO, a_job("hi", submit=70, runtime=100, priority=9)], NODES, "bestfit")
    assert state.outcomes["lo1"].preempted == 1 and state.outcomes["lo2"].preempted == 0
    assert state.outcomes["hi"].start_s == 100 and state.outcomes["lo1"].lost_gpu_s == 8 * 100


def test_no_preemption_for_equal_priority_nor_when_it_is_off_nor_while_every_run_is_protected():
    same = replay([*LOW_TWO, a_job("x", submit=100, runtime=100)], NODES, "bestfit")
    assert same.preemptions == 0 and same.outcomes["x"].start_s == 1000
    off = replay([*LOW_TWO, a_job("hi", submit=100, priority=9)], NODES, "bestfit",
                 preemption=PreemptionSettings(enabled=False))
    assert off.preemptions == 0 and off.outcomes["hi"].start_s == 1000
    young = replay([*LOW_TWO, a_job("hi", submit=55, priority=9)], NODES, "bestfit")  # both under 60 s
    assert young.preemptions == 0


FAIR = parse_tenancy({"version": 1, "flavors": ["A100"], "tenants": [{"name": "c", "children": [
    {"name": "t1", "quota": {"A100": {"nominal": 4}}}, {"name": "t2", "quota": {"A100": {"nominal": 4}}},
    {"name": "t3", "quota": {"A100": {"nominal": 8}}}]}]})
# t2 borrows 8 and fills both nodes but 2 GPUs each; at 1000 s t1 asks for three 4-GPU jobs (entitled 8 of the
# 16, t2 8): a1 fits quota but no node. t2's 2-GPU job comes a second later.
FAIR_JOBS = [a_job("b1", "t2", 6, runtime=5000), a_job("b2", "t2", 6, runtime=5000),
             *(a_job(f"a{i}", "t1", 4, submit=1000) for i in (1, 2, 3)), a_job("b3", "t2", 2, submit=1001)]


@pytest.mark.parametrize(("settings", "waits", "preempted"), [
    # t2 at 1.5 of its fair share, t1 at 0.5 once a1 runs: b1 (older than the quantum) is preempted, a1 and a2
    # start on its node after the grace; b3 is held back (fair backfill) until they do
    pytest.param(PreemptionSettings(), {"a1": 30, "a2": 30, "a3": 130, "b3": 29}, ["b1"], id="as-live"),
    pytest.param(PreemptionSettings(fair_margin=None), {"a1": 4000, "a2": 4000, "a3": 4000, "b3": 0}, [],
                 id="fair-share-off"),
    # backfill held back without preemption to make room: b3 waits as long as t1's jobs
    pytest.param(PreemptionSettings(fair_preemption=False), {"a1": 4000, "a2": 4000, "a3": 4000, "b3": 3999}, [],
                 id="fair-backfill-alone"),
    pytest.param(PreemptionSettings(fair_quantum_s=1200), {"a1": 4000, "a2": 4000, "a3": 4000, "b3": 3999}, [],
                 id="every-run-younger-than-the-quantum"),
])
def test_fair_share_is_replayed_as_the_live_services_apply_it(settings, waits, preempted):
    state = replay(FAIR_JOBS, NODES, "bestfit", FAIR, preemption=settings)
    assert {k: o.wait_s for k, o in state.outcomes.items() if k in waits} == pytest.approx(waits)
    assert [k for k, o in state.outcomes.items() if o.preempted] == preempted
    assert state.max_overshoot_units <= 0


def test_a_gang_is_preempted_whole_and_the_count_is_per_run():
    """A 16-GPU gang of priority 0 holds both nodes; two priority-9 jobs arrive: one preemption frees both."""
    jobs = [a_job("gang", gpus=16, runtime=1000), a_job("hi1", submit=100, runtime=50, priority=9),
            a_job("hi2", submit=100, runtime=50, priority=9)]
    state = replay(jobs, NODES, "bestfit")
    assert state.preemptions == 1 and state.outcomes["gang"].lost_gpu_s == 16 * 130
    assert state.outcomes["hi1"].start_s == 130 and state.outcomes["hi2"].start_s == 130  # the gang held both
    assert state.outcomes["gang"].end_s == 180 + 1000  # it reruns once both have ended


def test_the_cli_table_says_preemptions_and_the_gpu_hours_lost():
    from gpusched_simulation.whatif.report import table

    jobs = [*LOW_TWO, a_job("hi", submit=100, runtime=100, priority=9)]
    text = table(run_all(jobs, NODES, ["bestfit"], {"": None}))
    header, _, row = text.splitlines()[:3]
    assert "PREEMPT." in header and "LOST GPU-h" in header
    assert row.split()[-3:] == ["1", "0.2", "0"], row
