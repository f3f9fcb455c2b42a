"""Scenario tables: who is preempted, and who is not, for each kind of trigger and request."""

from __future__ import annotations

import pytest

from gpusched_core.preemption import (
    FairShareTrigger,
    ReclaimRequest,
    SelectionConfig,
    TenantQuota,
    select_victims,
)

from .builders import a_cluster, a_node, gang, mig_slice, share, whole

NOW = 10_000.0
EIGHT = tuple(range(8))


def two_nodes():
    return a_cluster(a_node("n1").gpus(8), a_node("n2").gpus(8))


def victims(plan) -> set[str]:
    return set(plan.victim_ids)


# --- priority preemption ---------------------------------------------------------------------

PRIORITY_CASES = [
    pytest.param(
        lambda: two_nodes().run("a", "n1", (0, 1, 2, 3)).run("b", "n1", (4, 5, 6, 7))
        .run("c", "n2", (0, 1)).run("d", "n2", (2, 3)).run("e", "n2", (4, 5)).run("f", "n2", (6, 7)),
        whole("hp", 8), {"a", "b"}, id="fewest_victims_two_big_jobs_rather_than_four_small_ones"),
    pytest.param(
        lambda: two_nodes().run("a", "n1", tuple(range(8)), priority=10).run("b", "n2", tuple(range(8)), priority=0),
        whole("hp", 4), {"b"}, id="lower_priority_first_among_equally_few"),
    pytest.param(
        lambda: two_nodes().run("a", "n1", tuple(range(8)), checkpoint=NOW - 1800)
        .run("b", "n2", tuple(range(8)), checkpoint=NOW - 120),
        whole("hp", 4), {"b"}, id="less_work_lost_since_checkpoint_first"),
    pytest.param(
        lambda: two_nodes().run("a", "n1", tuple(range(8)), started=100, checkpoint=NOW - 60)
        .run("b", "n2", tuple(range(8)), started=500, checkpoint=NOW - 60),
        whole("hp", 4), {"b"}, id="younger_first_when_equal_loss"),
    pytest.param(
        lambda: two_nodes().run("b", "n1", EIGHT, checkpoint=NOW).run("a", "n2", EIGHT, checkpoint=NOW),
        whole("hp", 4), {"a"}, id="job_id_breaks_the_last_tie"),
    pytest.param(
        lambda: two_nodes().run("a", "n1", (0, 1, 2, 3), priority=0).run("b", "n1", (4, 5, 6, 7), priority=200)
        .run("c", "n2", (0, 1, 2, 3), priority=5).run("d", "n2", (4, 5, 6, 7), priority=5),
        whole("hp", 8), {"c", "d"}, id="never_a_job_of_higher_priority_even_if_it_means_more_lost"),
    pytest.param(
        lambda: two_nodes().run("a", "n1", (0, 1), priority=0).run("h", "n1", (2, 3, 4, 5, 6, 7), priority=100)
        .run("b", "n2", (0, 1, 2, 3, 4, 5), priority=0).run("c", "n2", (6,), priority=0),
        whole("hp", 2), {"c"}, id="free_gpus_count_so_the_smallest_loss_is_enough"),
]


@pytest.mark.parametrize(("cluster", "preemptor", "expected"), PRIORITY_CASES)
def test_priority_preemption_chooses(cluster, preemptor, expected):
    built = cluster()
    plan = select_victims(built.snapshot, preemptor, built.jobs, NOW)
    assert plan.outcome == "preempt"
    assert victims(plan) == expected
    assert plan.placement is not None and plan.placement.placed


NONE_CASES = [
    pytest.param(lambda: two_nodes().run("a", "n1", EIGHT, priority=100).run("b", "n2", EIGHT, priority=300),
                 whole("hp", 1), "equal or higher priority", id="equal_or_higher_priority_is_never_a_victim"),
    pytest.param(lambda: two_nodes().run("a", "n1", EIGHT, started=NOW - 30).run("b", "n2", EIGHT, started=NOW - 10),
                 whole("hp", 1), "protected", id="runs_younger_than_the_minimum_run_time_are_protected"),
    pytest.param(lambda: a_cluster(a_node("n1").gpus(8, "T4")).run("a", "n1", tuple(range(8))),
                 whole("hp", 1, models=("A100",)), "no GPU of an allowed model",
                 id="freed_gpus_of_the_wrong_model_do_not_count"),
    pytest.param(lambda: two_nodes().run("a", "n1", (0, 1, 2, 3)).run("h", "n1", (4, 5, 6, 7), priority=100)
                 .run("b", "n2", (0, 1, 2, 3)).run("i", "n2", (4, 5, 6, 7), priority=100),
                 whole("hp", 6), "fewer than 6 fully free GPUs", id="no_preemption_when_it_would_not_let_the_job_run"),
]


@pytest.mark.parametrize(("cluster", "preemptor", "why"), NONE_CASES)
def test_nothing_is_preempted_when(cluster, preemptor, why):
    built = cluster()
    config = SelectionConfig(min_runtime_s={"batch": 60})
    plan = select_victims(built.snapshot, preemptor, built.jobs, NOW, config=config)
    assert plan.outcome == "none"
    assert plan.victims == ()
    assert any(why in reason for reason in plan.reasons), plan.reasons


def test_protection_spares_young_runs_and_takes_an_older_one_instead():
    built = two_nodes().run("young", "n1", EIGHT, started=NOW - 30).run("old", "n2", EIGHT, started=0)
    config = SelectionConfig(min_runtime_s={"batch": 60})
    plan = select_victims(built.snapshot, whole("hp", 2), built.jobs, NOW, config=config)
    assert victims(plan) == {"old"}


def test_a_job_that_fits_needs_no_preemption():
    built = two_nodes().run("a", "n1", (0, 1))
    plan = select_victims(built.snapshot, whole("hp", 8), built.jobs, NOW)
    assert plan.outcome == "fits" and plan.victims == ()


def test_jobs_already_being_preempted_are_awaited_not_joined_by_new_victims():
    built = a_cluster(a_node("n1").gpus(8)).run("going", "n1", (0, 1, 2, 3), preempting=True)
    built.run("b", "n1", (4, 5, 6, 7))
    plan = select_victims(built.snapshot, whole("hp", 4), built.jobs, NOW)
    assert plan.outcome == "await"
    assert plan.awaiting == ("going",)
    assert plan.victims == ()


# --- MIG and fractional victims --------------------------------------------------------------


def mig_node():
    return a_cluster(a_node("m1").gpus(1, "NVIDIA-A100-SXM4-80GB").mig_mode(0))


def test_mig_victim_frees_a_valid_slice_position_not_just_enough_slices():
    # 3g.40gb starts only at slice 0 or 4. Freeing "a" at 0 leaves the high job at 2 in the way.
    built = (mig_node().run("a", "m1", (0,), mig=("1g.10gb", 0), checkpoint=NOW)
             .run("h", "m1", (0,), mig=("1g.10gb", 2), priority=100)
             .run("b", "m1", (0,), mig=("1g.10gb", 4), checkpoint=NOW - 600))
    plan = select_victims(built.snapshot, mig_slice("hp", "3g.40gb"), built.jobs, NOW)
    assert victims(plan) == {"b"}
    assert plan.placement.bindings[0].mig.start == 4


def test_mig_no_preemption_when_high_priority_slices_block_every_position():
    built = mig_node().run("h1", "m1", (0,), mig=("1g.10gb", 1), priority=100)
    built.run("h2", "m1", (0,), mig=("1g.10gb", 5), priority=100)
    built.run("a", "m1", (0,), mig=("1g.10gb", 0))
    plan = select_victims(built.snapshot, mig_slice("hp", "3g.40gb"), built.jobs, NOW)
    assert plan.outcome == "none"


def test_fractional_victims_one_share_is_enough_for_a_smaller_share():
    built = (a_cluster(a_node("n1").gpus(2)).run("s1", "n1", (0,), milli=500, checkpoint=NOW - 300)
             .run("s2", "n1", (0,), milli=500, checkpoint=NOW - 30)
             .run("s3", "n1", (1,), milli=400).run("h", "n1", (1,), milli=600, priority=100))
    plan = select_victims(built.snapshot, share("hp", 450), built.jobs, NOW)
    assert victims(plan) == {"s2"}


def test_fractional_victims_a_whole_gpu_needs_every_share_on_one_gpu():
    built = (a_cluster(a_node("n1").gpus(2)).run("s1", "n1", (0,), milli=500).run("s2", "n1", (0,), milli=500)
             .run("s3", "n1", (1,), milli=400).run("h", "n1", (1,), milli=600, priority=100))
    plan = select_victims(built.snapshot, whole("hp", 1), built.jobs, NOW)
    assert victims(plan) == {"s1", "s2"}


# --- gangs -----------------------------------------------------------------------------------


def test_a_gang_victim_is_preempted_whole_and_counts_once():
    built = two_nodes().gang("g", [("n1", tuple(range(8))), ("n2", (0, 1, 2, 3))]).run("a", "n2", (4, 5, 6, 7))
    plan = select_victims(built.snapshot, whole("hp", 8), built.jobs, NOW)
    assert victims(plan) == {"g"}
    assert plan.victims[0].allocation_ids == ("g/0", "g/1")


def test_a_gang_preemptor_takes_the_nodes_with_fewest_victims():
    built = (a_cluster(a_node("n1").gpus(8), a_node("n2").gpus(8), a_node("n3").gpus(8))
             .run("a", "n1", tuple(range(8))).run("b", "n2", (0, 1, 2, 3)).run("c", "n2", (4, 5, 6, 7))
             .run("d", "n3", tuple(range(8))))
    plan = select_victims(built.snapshot, gang("g", 2, 8), built.jobs, NOW)
    assert victims(plan) == {"a", "d"}
    assert sorted(plan.placement.node_ids) == ["n1", "n3"]


# --- reclaim and fair share ------------------------------------------------------------------


def tenants():
    return (two_nodes().run("own", "n1", (0, 1, 2, 3), tenant="a", priority=0)
            .run("within", "n1", (4, 5, 6, 7), tenant="c", priority=0)
            .run("borrowed", "n2", (0, 1, 2, 3), tenant="b", priority=500)
            .run("b2", "n2", (4, 5, 6, 7), tenant="b", priority=500))


def test_reclaim_takes_borrowed_usage_of_any_priority_and_never_the_reclaimer_or_tenants_within_quota():
    built = tenants()
    trigger = ReclaimRequest("a", (("b", 4000),), 4000, flavor="A10")
    plan = select_victims(built.snapshot, whole("ra", 4, tenant="a", priority=0), built.jobs, NOW, trigger=trigger)
    assert plan.outcome == "preempt"
    assert victims(plan) <= {"borrowed", "b2"} and len(plan.victims) == 1
    assert plan.victims[0].reason.startswith("preempted to return borrowed A10 capacity to tenant a (under its "
                                             "nominal quota) for its job ra: tenant b borrowed it; lost ")


def test_reclaim_stops_once_the_borrower_no_longer_borrows():
    built = tenants()
    trigger = ReclaimRequest("a", (("b", 1000),), 1000)  # b borrows 1 GPU: only one of its jobs may go
    plan = select_victims(built.snapshot, whole("ra", 8, tenant="a", priority=0), built.jobs, NOW, trigger=trigger)
    assert plan.outcome == "none"


def test_cross_tenant_priority_preemption_takes_only_from_borrowing_tenants():
    built = tenants()
    quota = {"a": TenantQuota(8000, 4000), "c": TenantQuota(8000, 4000), "b": TenantQuota(0, 8000)}
    plan = select_victims(built.snapshot, whole("x", 4, tenant="b", priority=1000), built.jobs, NOW, quota=quota)
    assert victims(plan) == {"borrowed"} or victims(plan) == {"b2"}  # own tenant's lower-priority jobs
    plan = select_victims(built.snapshot, whole("y", 4, tenant="d", priority=1000), built.jobs, NOW, quota=quota)
    assert plan.victims and all(v.tenant == "b" for v in plan.victims)


def test_fair_share_preemption_is_off_by_default_and_then_takes_from_the_tenant_over_its_share():
    built = tenants()
    trigger = FairShareTrigger({"a": 4000, "b": 8000, "c": 4000}, {"a": 1.0, "b": 1.0, "c": 1.0})
    preemptor = whole("fa", 4, tenant="a", priority=500)
    assert select_victims(built.snapshot, preemptor, built.jobs, NOW, trigger=trigger).outcome == "none"
    plan = select_victims(built.snapshot, whole("fd", 4, tenant="d", priority=500), built.jobs, NOW, trigger=trigger,
                          config=SelectionConfig(fair_share_enabled=True))
    assert plan.outcome == "preempt" and all(v.tenant == "b" for v in plan.victims)


# --- reasons ---------------------------------------------------------------------------------


def test_both_sides_carry_their_reasons():
    built = a_cluster(a_node("n1").gpus(8)).run("a", "n1", tuple(range(8)), tenant="u", checkpoint=NOW - 240)
    plan = select_victims(built.snapshot, whole("X", 8, tenant="T", priority=100), built.jobs, NOW,
                          config=SelectionConfig(cross_tenant="any"))
    assert plan.victims[0].reason == "preempted for job X of priority 100 in tenant T; lost 4 min since last checkpoint"
    assert any("preempting 1 job on n1 so that X fits: a (tenant u, priority 0" in r for r in plan.reasons)
    assert any("fewest victims: 1 victim, the proven minimum" in r for r in plan.reasons)
