"""The replay loop on small synthetic workloads, and a short window of the real Philly trace."""

from __future__ import annotations

import json

import pytest

from gpusched_simulation.queue.cli import main
from gpusched_simulation.queue.engine import SimConfig, simulate
from gpusched_simulation.queue.policies import Policy, make_policies
from gpusched_simulation.queue.report import METRIC_KEYS
from gpusched_simulation.queue.quota import QuotaSetup, tenancy_for
from gpusched_simulation.traces.philly import TraceJob, default_trace_path

POLICIES = make_policies()


def job(job_id: str, tenant: str, at: float, duration: float, gpus: int = 1) -> TraceJob:
    return TraceJob(job_id, tenant, at, duration, gpus)


def run(jobs, policy: str, nominal: dict, borrow: int | None = 8, nodes: int = 1, **config):
    tenancy = tenancy_for(QuotaSetup(nominal, borrow), POLICIES[policy].half_life_s)
    return simulate(jobs, tenancy, POLICIES[policy], SimConfig(nodes=nodes, gpus_per_node=8, **config))


def completions(state) -> dict[str, float]:
    return {job_id: s.completed_s for job_id, s in state.jobs.items()}


def test_fifo_runs_jobs_in_arrival_order_when_the_cluster_is_full():
    jobs = [job("a", "t1", 0, 100, 8), job("b", "t1", 1, 10, 8), job("c", "t1", 2, 10, 8)]
    assert completions(run(jobs, "fifo", {"t1": 8})) == {"a": 100, "b": 110, "c": 120}


def test_oracle_sjf_runs_the_shortest_waiting_job_first():
    jobs = [job("a", "t1", 0, 100, 8), job("b", "t1", 1, 50, 8), job("c", "t1", 2, 10, 8)]
    assert completions(run(jobs, "sjf", {"t1": 8})) == {"a": 100, "c": 110, "b": 160}


def test_a_borrower_is_preempted_when_the_owner_returns():
    jobs = [job("borrow", "t2", 0, 1000, 8), job("own", "t1", 10, 100, 4)]
    state = run(jobs, "drf", {"t1": 4, "t2": 4})
    assert state.preemptions == 1
    assert state.jobs["own"].completed_s == 110
    assert state.max_overshoot_units == 0


def test_fifo_never_preempts_and_the_owner_waits():
    jobs = [job("borrow", "t2", 0, 1000, 8), job("own", "t1", 10, 100, 4)]
    state = run(jobs, "fifo", {"t1": 4, "t2": 4})
    assert state.preemptions == 0 and state.jobs["own"].completed_s == 1100


def test_las_preempts_a_long_runner_for_a_new_job_and_resumes_it_with_overhead():
    jobs = [job("long", "t1", 0, 10_000, 8), job("short", "t1", 5000, 60, 8)]
    state = run(jobs, "tiresias", {"t1": 8}, las_threshold_gpu_s=3600, preempt_overhead_s=30)
    assert state.jobs["short"].completed_s == 5060
    assert state.jobs["long"].completed_s == 10_000 + 60 + 30


def test_quota_is_never_exceeded_with_a_small_borrowing_limit():
    jobs = [job(f"j{i}", "t1" if i % 3 else "t2", i * 5.0, 300 + 37 * i, 1 + i % 4) for i in range(60)]
    for name in POLICIES:
        state = run(jobs, name, {"t1": 8, "t2": 8}, borrow=2, nodes=2)
        assert state.max_overshoot_units == 0
        assert all(s.completed_s is not None for s in state.jobs.values())


@pytest.mark.skipif(not default_trace_path().is_file(), reason="shared Philly trace not present")
def test_a_short_philly_window_replays_under_every_policy(tmp_path, capsys):
    out = tmp_path / "queue.json"
    status = main(["--days", "1", "--max-jobs", "300", "--nodes", "8", "--json", str(out), "--quiet"])
    assert status == 0
    document = json.loads(out.read_text())
    assert document["default_policy"] == "fairshare"
    assert list(document["policies"]) == ["fifo", "sjf", "tiresias", "drf", "fairshare"]
    for metrics in document["policies"].values():
        assert tuple(metrics) == METRIC_KEYS
        assert metrics["max_quota_overshoot_gpus"] == 0
        assert metrics["jobs"] == 300
    assert "fairshare (default)" in capsys.readouterr().out


def test_a_reclaim_preempts_the_fewest_borrowed_gpus_that_let_the_owner_start():
    jobs = [job("big", "t2", 0, 10_000, 8)] + [job(f"s{i}", "t2", 1 + i, 10_000) for i in range(8)]
    jobs.append(job("own", "t1", 100, 50))
    for name in ("drf", "fairshare"):
        state = run(jobs, name, {"t1": 8, "t2": 8}, borrow=8, nodes=2)
        assert state.preemptions == 1, name
        assert state.jobs["big"].preemptions == 0 and state.jobs["big"].completed_s == 10_000
        assert state.jobs["own"].completed_s == 150
        assert state.max_overshoot_units == 0


def _las_policy(fair_gangs: bool) -> Policy:
    return Policy("las", "fairshare", 0.0, las=True, reclaim=False, fair_gang_preemption=fair_gangs)


@pytest.mark.parametrize("fair_gangs, t3_nominal, starts_at", [(False, 21, 5000), (True, 21, 5000), (True, 13, 20_000)],
                         ids=["plain-las", "fair-gangs-under-share", "fair-gangs-at-share"])
def test_a_whole_node_job_preempts_another_tenant_only_when_that_tenant_is_above_its_fair_share(fair_gangs, t3_nominal,
                                                                                                starts_at):
    # t2 (nominal 2) holds 8 GPUs and wants no more; t1 (nominal 1) holds 8 and asks for a node. t3 leaves its
    # quota idle: with 21 (a pool of 24) t1 is entitled to the other 16, so it is under its fair share (0.5)
    # and t2 over it (1.0): t2 loses a run; with 13 (a pool of 16, all held) both are at their share and
    # t1's own quota could come only from its runs, still in the first queue: t1-b waits
    jobs = [job("t2-a", "t2", 0, 20_000, 4), job("t2-b", "t2", 1, 20_000, 4), job("t1-a", "t1", 4700, 20_000, 8),
            job("t1-b", "t1", 5000, 100, 8)]
    tenancy = tenancy_for(QuotaSetup({"t1": 1, "t2": 2, "t3": t3_nominal}, 16), 0.0)
    state = simulate(jobs, tenancy, _las_policy(fair_gangs), SimConfig(nodes=2, gpus_per_node=8))
    assert state.jobs["t1-b"].completed_s == starts_at + 100
    assert (state.jobs["t2-a"].preemptions + state.jobs["t2-b"].preemptions == 0) == (starts_at > 5000)
    assert state.max_overshoot_units == 0


def test_a_reclaim_preempts_nothing_when_the_owner_could_not_start_anyway():
    # t2 borrows 4 GPUs next to t3's 4 on one node; the owner t1 asks for a whole node: releasing t2's job
    # frees quota but no node, so preempting it would only strand it
    jobs = [job("t3-a", "t3", 0, 1000, 8), job("t3-b", "t3", 0, 1000, 4), job("t2-a", "t2", 1, 1000, 4),
            job("own", "t1", 10, 100, 8)]
    for name in ("drf", "fairshare"):
        state = run(jobs, name, {"t1": 8, "t2": 0, "t3": 12}, borrow=8, nodes=2)
        assert state.preemptions == 0, name
        assert state.jobs["t2-a"].completed_s == 1001 and state.jobs["own"].completed_s == 1100
        assert state.max_overshoot_units == 0


def test_a_reclaim_takes_no_run_that_would_push_its_tenant_below_its_nominal_quota():
    # t2 borrows 3 GPUs (8 on 5), t3 borrows 5 (8 on 3); every run holds 4: only t3's runs keep their tenant
    # at or above nominal, though t2's younger run costs the least lost work
    jobs = [job("t3-a", "t3", 0, 1000, 4), job("t3-b", "t3", 1, 1000, 4), job("t2-a", "t2", 2, 1000, 4),
            job("t2-b", "t2", 3, 1000, 4), job("own", "t1", 10, 100, 4)]
    for name in ("drf", "fairshare"):
        state = run(jobs, name, {"t1": 8, "t2": 5, "t3": 3}, borrow=8, nodes=2)
        assert state.preemptions == 1, name
        assert state.jobs["t3-b"].preemptions == 1 and state.jobs["own"].completed_s == 110
        assert state.jobs["t2-a"].preemptions == state.jobs["t2-b"].preemptions == 0


@pytest.mark.parametrize("margin, preempted", [(0.2, 1), (None, 0)])
def test_a_tenant_under_its_fair_share_preempts_one_far_over_it(margin, preempted):
    # t3 leaves its 8 GPUs idle, so t1 and t2 are each entitled to 8 of the 16; t2 holds 12 (share 1.5),
    # t1's second job takes it to its 8 (share 1.0): fair-share preemption takes one of t2's runs
    policy = Policy("fair", "fairshare", 21600.0, las=False, reclaim=True, fair_preemption_margin=margin)
    jobs = [job("t1-a", "t1", 0, 10_000, 4), *(job(f"t2-{i}", "t2", 0, 10_000, 4) for i in range(3)),
            job("t1-b", "t1", 2000, 100, 4)]
    tenancy = tenancy_for(QuotaSetup({"t1": 4, "t2": 4, "t3": 8}, 16), policy.half_life_s)
    state = simulate(jobs, tenancy, policy, SimConfig(nodes=2, gpus_per_node=8))
    assert state.preemptions == preempted
    assert (state.jobs["t1-b"].completed_s == 2100) == bool(preempted)
    assert state.max_overshoot_units == 0


def _blocked_t1_beside_t2(fair_backfill: bool, *, t1_b_gpus: int, t1_c_gpus: int):
    """Two 8-GPU nodes: t1 (nominal 14) holds 6 GPUs and waits with t1-b and t1-c; t2 (nominal 2) holds 8
    one-GPU runs ending one every 100 s and has 8 more waiting."""
    policy = Policy("fair", "fairshare", 21600.0, las=False, reclaim=False, fair_preemption_margin=0.5,
                    fair_quantum_s=10**9, fair_backfill=fair_backfill)
    jobs = [job("t1-a", "t1", 0, 10_000, 6), *(job(f"t2-{i}", "t2", 0, 100 * (i + 1)) for i in range(8)),
            job("t1-b", "t1", 10, 100, t1_b_gpus), job("t1-c", "t1", 10, 100, t1_c_gpus),
            *(job(f"t2-new-{i}", "t2", 10, 10_000) for i in range(8))]
    tenancy = tenancy_for(QuotaSetup({"t1": 14, "t2": 2, "t3": 2}, 16), policy.half_life_s)
    return simulate(jobs, tenancy, policy, SimConfig(nodes=2, gpus_per_node=8))


@pytest.mark.parametrize("fair_backfill, t1_b_starts_at", [(True, 400), (False, 600)],
                         ids=["held-back", "plain-backfill"])
def test_a_tenant_far_over_its_share_does_not_backfill_the_room_a_blocked_job_of_a_tenant_under_it_waits_for(
        fair_backfill, t1_b_starts_at):
    # t1 (nominal 14) holds 6 GPUs of node 0 and waits for 4 on one node (t1-c keeps its demand up: entitled
    # 15.75 of the pool of 18); t2 (nominal 2, entitled 2.25) holds 8 one-GPU runs over both nodes, which end
    # one every 100 s, and has 8 more waiting. Quota has room for t1-b, the nodes have 2 + 2 GPUs. Held back,
    # t2 leaves the holes to drain and t1-b starts when node 1 has 4 (at 400); else t2 refills the holes
    # as they open and t1-b starts later
    state = _blocked_t1_beside_t2(fair_backfill, t1_b_gpus=4, t1_c_gpus=6)
    assert state.jobs["t1-b"].completed_s == t1_b_starts_at + 100
    assert state.preemptions == 0 and state.max_overshoot_units == 0


@pytest.mark.parametrize("fair_backfill, t1_b_starts_at", [(True, 800), (False, 10_400)],
                         ids=["held-back", "plain-backfill"])
def test_a_job_larger_than_all_that_is_free_holds_back_tenants_far_over_their_share_too(fair_backfill,
                                                                                         t1_b_starts_at):
    # as above, but t1-b asks for a whole node while 2 GPUs are free: the cohort's quota skips it without
    # asking the nodes, and it still holds t2 back (node 1 drains by 800); else t2 keeps every hole filled.
    # (t1-c, a gang of both nodes, keeps t1's demand up and cannot start before t1-b)
    state = _blocked_t1_beside_t2(fair_backfill, t1_b_gpus=8, t1_c_gpus=16)
    assert state.jobs["t1-b"].completed_s == t1_b_starts_at + 100
    assert state.preemptions == 0 and state.max_overshoot_units == 0


def test_preemptions_are_counted_by_cause_with_the_gpu_hours_their_victims_spent_restoring():
    las = run([job("long", "t1", 0, 10_000, 8), job("short", "t1", 5000, 60, 8)], "tiresias", {"t1": 8},
              las_threshold_gpu_s=3600, preempt_overhead_s=30)
    reclaim = run([job("borrow", "t2", 0, 1000, 8), job("own", "t1", 10, 100, 4)], "drf", {"t1": 4, "t2": 4})
    assert las.preemption_causes == {"las own tenant": 1} and las.restore_gpu_s == 30 * 8
    assert reclaim.preemption_causes == {"reclaim": 1} and reclaim.restore_gpu_s == 60 * 8
