"""Reclaim (quota asks for borrowed capacity back): only borrowers' jobs of the flavor, the fewest that
make room, enough quota given back, and nothing more for a request already being served."""

from __future__ import annotations

import pytest

from gpusched_core.placement import PodRequest, RequestId, WholeGpus
from gpusched_core.preemption import FreedFor, Preemptor, ReclaimAsk, plan_reclaim, quota_need_units

from .builders import a_cluster, a_node

GPU = 7000  # quota units per GPU
NOW = 10_000.0
A100, H100 = "A100-80GB", "H100-80GB"


def blocked(job_id: str = "a1", gpus: int = 4, model: str = A100) -> Preemptor:
    request = PodRequest(RequestId(job_id), WholeGpus(gpus), allowed_models=frozenset({model}))
    return Preemptor(job_id, "team-a", 0, request, gpus * GPU)


def ask(short_gpus: int = 4, borrowers=(("team-b", 4),), flavor: str = A100, at: float = NOW) -> ReclaimAsk:
    return ReclaimAsk("team-a", flavor, short_gpus * GPU, tuple((t, g * GPU) for t, g in borrowers), at)


def cluster():
    return a_cluster(a_node("n1").gpus(8, A100), a_node("n2").gpus(8, H100))


def full_a100():
    """n1's eight A100s: team-b borrows with b4 (4 GPUs) and b2 (2); team-c runs c2 within its quota;
    team-b also runs on the H100s of n2."""
    return (cluster().run("b4", "n1", (0, 1, 2, 3), tenant="team-b", units=4 * GPU)
            .run("b2", "n1", (4, 5), tenant="team-b", units=2 * GPU)
            .run("c2", "n1", (6, 7), tenant="team-c", units=2 * GPU)
            .run("bh", "n2", tuple(range(8)), tenant="team-b", units=8 * GPU))


def test_reclaim_preempts_the_fewest_borrower_jobs_of_the_flavor_and_says_why():
    built = full_a100()
    plan = plan_reclaim(built.snapshot, blocked(), ask(), built.jobs, (), NOW)
    assert plan.outcome == "preempt" and plan.victim_ids == ("b4",)
    assert plan.victims[0].reason.startswith(
        "preempted to return borrowed A100-80GB capacity to tenant team-a (under its nominal quota) for its job a1: "
        "tenant team-b borrowed it; lost ")
    assert plan.reasons[1] == "preempting 1 job(s) of the borrowers (b4) to give back 4 A100-80GB GPU(s) of quota"
    assert [str(b.node_id) for b in plan.placement.bindings] == ["n1"]


def test_nothing_to_reclaim_when_the_borrowers_hold_no_job_of_the_flavor():
    built = cluster().run("c8", "n1", tuple(range(8)), tenant="team-c", units=8 * GPU) \
        .run("bh", "n2", tuple(range(8)), tenant="team-b", units=8 * GPU)
    plan = plan_reclaim(built.snapshot, blocked(), ask(), built.jobs, (), NOW)
    assert plan.outcome == "none" and not plan.victims
    assert plan.reasons[1] == ("nothing to reclaim: borrowers (team-b) hold no preemptible job of A100-80GB "
                               "(1 running job(s) not on A100-80GB)")


@pytest.mark.parametrize("borrowed_gpus, victims", [
    pytest.param(4, {"b4"}, id="borrowing-4-loses-the-4-gpu-job"),
    pytest.param(1, {"b4"}, id="borrowing-1-still-loses-one-job-then-stops"),
])
def test_a_borrower_loses_jobs_only_while_it_still_borrows(borrowed_gpus, victims):
    built = full_a100()
    plan = plan_reclaim(built.snapshot, blocked(), ask(borrowers=(("team-b", borrowed_gpus),)), built.jobs, (), NOW)
    assert set(plan.victim_ids) == victims


def test_no_victims_when_the_borrower_may_not_lose_enough():
    built = (cluster().run("b2", "n1", (0, 1), tenant="team-b", units=2 * GPU)
             .run("b2x", "n1", (2, 3), tenant="team-b", units=2 * GPU)
             .run("c4", "n1", (4, 5, 6, 7), tenant="team-c", units=4 * GPU))
    plan = plan_reclaim(built.snapshot, blocked(), ask(borrowers=(("team-b", 1),)), built.jobs, (), NOW)
    assert plan.outcome == "none" and not plan.victims  # one 2-GPU job may go; 4 GPUs are needed


def test_a_repeated_request_while_the_victims_stop_preempts_nothing_more():
    built = (cluster().run("b4", "n1", (0, 1, 2, 3), tenant="team-b", units=4 * GPU, preempting=True,
                           preempted_for="a1")
             .run("b2", "n1", (4, 5), tenant="team-b", units=2 * GPU)
             .run("b2y", "n1", (6, 7), tenant="team-b", units=2 * GPU))
    freed = (FreedFor("b4", 4 * GPU, None),)
    plan = plan_reclaim(built.snapshot, blocked(), ask(borrowers=(("team-b", 8),)), built.jobs, freed, NOW)
    assert plan.outcome == "await" and not plan.victims and plan.awaiting == ("b4",)
    assert plan.reasons[1].startswith("nothing more to reclaim: jobs already stopping for a1 (b4)")


def test_jobs_stopping_for_another_job_are_neither_victims_nor_room_for_this_one():
    built = (cluster().run("b4", "n1", (0, 1, 2, 3), tenant="team-b", units=4 * GPU, preempting=True,
                           preempted_for="other")
             .run("b2", "n1", (4, 5), tenant="team-b", units=2 * GPU)
             .run("b2y", "n1", (6, 7), tenant="team-b", units=2 * GPU))
    plan = plan_reclaim(built.snapshot, blocked(), ask(borrowers=(("team-b", 8),)), built.jobs, (), NOW)
    assert plan.outcome == "preempt" and set(plan.victim_ids) == {"b2", "b2y"}


def test_a_request_made_before_earlier_victims_gave_quota_back_is_stale():
    built = full_a100()
    freed = (FreedFor("old", 4 * GPU, NOW + 5),)  # its quota went back after the request was made
    plan = plan_reclaim(built.snapshot, blocked(), ask(at=NOW), built.jobs, freed, NOW + 10)
    assert plan.outcome == "await" and not plan.victims
    assert "old gave back quota for a1 after this request was made" in plan.reasons[1]


def test_victims_are_added_for_quota_when_the_job_fits_but_its_quota_is_borrowed():
    built = (cluster().run("b2", "n1", (0, 1), tenant="team-b", units=2 * GPU)
             .run("b1", "n1", (2,), tenant="team-b", units=1 * GPU)
             .run("b2y", "n2", (0, 1), tenant="team-b", units=2 * GPU))  # an H100 job pays back no A100 quota
    plan = plan_reclaim(built.snapshot, blocked(gpus=2), ask(short_gpus=2), built.jobs, (), NOW)
    assert plan.outcome == "preempt" and plan.victim_ids == ("b2",)  # the fewest: one 2-GPU job, not two
    assert plan.placement is not None and plan.placement.placed  # the free A100s are the slot to hold
    assert any(r.startswith("1 more victim(s) for quota: b2") for r in plan.reasons)


def test_a_job_that_fits_and_holds_its_quota_needs_no_victim():
    built = cluster().run("b2", "n1", (0, 1), tenant="team-b", units=2 * GPU)
    plan = plan_reclaim(built.snapshot, blocked(gpus=2), ask(short_gpus=2), built.jobs, (), NOW, quota_reserved=True)
    assert plan.outcome == "fits" and not plan.victims
    assert plan.reasons[1].startswith("nothing to reclaim: a1 fits on free A100-80GB capacity")


def test_not_enough_borrowed_quota_of_the_flavor_preempts_nothing():
    built = cluster().run("b1", "n1", (0,), tenant="team-b", units=1 * GPU)
    plan = plan_reclaim(built.snapshot, blocked(gpus=4), ask(short_gpus=4), built.jobs, (), NOW)
    assert plan.outcome == "none" and not plan.victims
    assert plan.reasons[1] == ("nothing to reclaim: the borrowers' preemptible A100-80GB jobs give back only 1 "
                               "of the 4 GPU(s) of quota a1 lacks")


@pytest.mark.parametrize("short, job, reserved, freed, need", [
    pytest.param(4, 4, False, (), 4, id="owed-what-it-needs"),
    pytest.param(8, 4, False, (), 4, id="at-most-its-own-units"),
    pytest.param(2, 4, False, (), 2, id="at-most-the-shortfall"),
    pytest.param(4, 4, True, (), 0, id="quota-already-reserved"),
    pytest.param(4, 4, False, (("v", 3, None),), 1, id="less-what-is-being-given-back"),
    pytest.param(4, 4, False, (("v", 3, 1.0),), 4, id="quota-given-back-already-counts-in-the-request"),
])
def test_quota_the_victims_must_give_back(short, job, reserved, freed, need):
    freed_for = tuple(FreedFor(j, u * GPU, at) for j, u, at in freed)
    assert quota_need_units(ask(short_gpus=short), job * GPU, reserved, freed_for) == need * GPU
