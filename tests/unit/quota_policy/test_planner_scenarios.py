from __future__ import annotations

import pytest

from gpusched_core.quota import (
    QuotaBook,
    QuotaSnapshot,
    UsageHistory,
    WaitCategory,
    order_pending,
    plan_cycle,
)

from .builders import A100, a_cohort, a_job, gpus, org, team, tenancy_of, usage


def reserved(plan) -> list[str]:
    return [r.job_id for r in plan.reservations]


def waiting(plan) -> dict[str, str]:
    return {w.job_id: w.reason for w in plan.waiting}


# --- borrowing and lending ----------------------------------------------------------------------

BORROWING = [
    # (id, teams, usage, jobs (id, tenant, gpus), expected reserved)
    ("idle-sibling-lends", [team("team-a", 8, borrow=8), team("team-b", 8)], {}, [("j1", "team-a", 12)], ["j1"]),
    ("borrowing-limit-caps", [team("team-a", 8, borrow=2), team("team-b", 8)], {}, [("j1", "team-a", 12)], []),
    ("lending-limit-keeps-a-guarantee", [team("team-a", 8), team("team-b", 8, lend=2)], {},
     [("j1", "team-a", 10), ("j2", "team-a", 11)], ["j1"]),
    ("busy-sibling-has-nothing-to-lend", [team("team-a", 8), team("team-b", 8)], {"team_b": 8},
     [("j1", "team-a", 9)], []),
    ("zero-nominal-tenant-borrows", [team("team-a", 0, borrow=4), team("team-b", 8)], {}, [("j1", "team-a", 4)],
     ["j1"]),
]


@pytest.mark.parametrize("teams, used, jobs, expected", [c[1:] for c in BORROWING], ids=[c[0] for c in BORROWING])
def test_borrowing_and_lending(teams, used, jobs, expected):
    tenancy = a_cohort(*teams)
    pending = [a_job(j).tenant(t).gpus(g).submitted(i).pending() for i, (j, t, g) in enumerate(jobs)]
    assert reserved(plan_cycle(QuotaSnapshot(tenancy, usage(**used)), pending)) == expected


def test_an_organisation_borrowing_limit_caps_all_its_teams_together():
    tenancy = tenancy_of([org("acme", org("research", team("team-a", 4), team("team-b", 4), borrow=2),
                              org("platform", team("infra", 8)))])
    pending = [a_job("a").tenant("team-a").gpus(5).pending(), a_job("b").tenant("team-b").gpus(6).submitted(1).pending()]
    plan = plan_cycle(QuotaSnapshot(tenancy), pending)
    assert reserved(plan) == ["a"]  # research holds at most 8 + 2: 5 + 6 would be 11
    assert QuotaBook.from_usage(tenancy, plan.usage).available("team-b", A100) == gpus(5)
    assert reserved(plan_cycle(QuotaSnapshot(tenancy, plan.usage), [a_job("c").tenant("team-b").gpus(5).pending()])) == ["c"]


# --- order, tiers and priority classes ----------------------------------------------------------

def test_priority_class_goes_first_then_submission_time_then_job_id():
    tenancy = a_cohort(team("team-a", 16))
    jobs = [a_job("z").submitted(5).pending(), a_job("y").priority("high").submitted(9).pending(),
            a_job("x").submitted(5).pending(), a_job("w").priority("low").submitted(0).pending()]
    assert order_pending(QuotaSnapshot(tenancy), jobs) == ["y", "x", "z", "w"]


def test_a_tenant_under_nominal_quota_goes_before_borrowers_even_with_lower_priority():
    tenancy = a_cohort(team("team-a", 4), team("team-b", 4))
    snapshot = QuotaSnapshot(tenancy, usage(team_b=6))
    jobs = [a_job("borrower").tenant("team-b").priority("high").pending(),
            a_job("owner").tenant("team-a").priority("low").submitted(3).pending()]
    assert order_pending(snapshot, jobs) == ["owner", "borrower"]


def test_lower_dominant_share_goes_first_and_decayed_history_counts():
    tenancy = a_cohort(team("team-a", 8), team("team-b", 8), half_life_s=3600)
    heavy_past = {"team-a": UsageHistory(0.0, {A100: 8 * 3600 * 4.0})}  # 8 GPUs for 4 h, just ended
    jobs = [a_job("a").tenant("team-a").pending(), a_job("b").tenant("team-b").submitted(1).pending()]
    # team-b holds 1 of its 8 GPUs now; team-a holds none but used far more recently
    assert order_pending(QuotaSnapshot(tenancy, usage(team_b=1), heavy_past, now_s=0.0), jobs) == ["b", "a"]
    # two days (48 half-lives) later team-a's history has decayed below team-b's current share
    assert order_pending(QuotaSnapshot(tenancy, usage(team_b=1), heavy_past, now_s=86400 * 2), jobs) == ["a", "b"]


def test_weight_doubles_the_entitlement():
    # team-c leaves its 8 GPUs idle; both borrowers want 4 more GPUs than the 16 can hold, so the cohort is
    # shared by weight x nominal: 2:1 gives team-a 10.7 and team-b 5.3 (team-a at 8 is under its fair
    # share, team-b at 6 over it); 1:1 gives 8 each (team-a at 8 is then the further over)
    jobs = [a_job("b").tenant("team-b").gpus(4).pending(), a_job("a").tenant("team-a").gpus(4).submitted(1).pending()]
    for weight, first in ((2, "a"), (1, "b")):
        tenancy = a_cohort(team("team-a", 4, weight=weight), team("team-b", 4), team("team-c", 8))
        assert order_pending(QuotaSnapshot(tenancy, usage(team_a=8, team_b=6)), jobs)[0] == first


def test_a_priority_class_the_tenant_may_not_use_waits_with_a_reason():
    tenancy = a_cohort(team("team-a", 8, classes=["normal", "low"]))
    plan = plan_cycle(QuotaSnapshot(tenancy), [a_job("j").priority("high").pending()])
    assert plan.waiting[0].category is WaitCategory.PRIORITY_CLASS
    assert plan.waiting[0].reason == "priority class 'high' is not allowed for tenant team-a (allowed: low, normal)"


# --- reclaim ------------------------------------------------------------------------------------

def test_a_tenant_under_nominal_gets_a_reclaim_request_naming_the_borrowers():
    tenancy = a_cohort(team("team-a", 8), team("team-b", 4), team("team-c", 4))
    snapshot = QuotaSnapshot(tenancy, usage(team_a=2, team_b=9, team_c=5))
    jobs = [a_job("j1").gpus(3).pending(), a_job("j2").gpus(2).submitted(1).pending(),
            a_job("j3").gpus(4).submitted(2).pending()]
    plan = plan_cycle(snapshot, jobs)
    assert reserved(plan) == []
    [request] = plan.reclaims
    assert (request.tenant, request.flavor, request.units) == ("team-a", A100, gpus(5))  # j3 would exceed nominal
    assert request.for_jobs == ("j1", "j2")
    assert request.borrowers == (("team-b", gpus(5)), ("team-c", gpus(1)))
    assert waiting(plan)["j1"] == "tenant team-a under quota (2/8 A100) while others borrow its share; reclaim requested"


def test_no_reclaim_when_the_tenant_is_at_its_nominal_quota():
    tenancy = a_cohort(team("team-a", 4), team("team-b", 4))
    plan = plan_cycle(QuotaSnapshot(tenancy, usage(team_a=4, team_b=4)), [a_job("j").pending()])
    assert plan.reclaims == ()


# --- reasons and positions ----------------------------------------------------------------------

def test_waiting_reasons_read_as_sentences():
    tenancy = a_cohort(team("team-a", 16, borrow=8), team("team-b", 8), team("team-c", 4, borrow=0))
    snapshot = QuotaSnapshot(tenancy, usage(team_a=16, team_b=8, team_c=4))
    jobs = [a_job("at-quota").pending(), a_job("limit").tenant("team-c").submitted(1).pending(),
            a_job("never").tenant("team-c").gpus(5).submitted(2).pending()]
    reasons = waiting(plan_cycle(snapshot, jobs))
    assert reasons["at-quota"] == "tenant team-a at quota (16/16 A100) and cohort has nothing to lend"
    assert reasons["limit"] == "tenant team-c at its limit (4/4 A100 + borrowing 0); job needs 1"
    assert reasons["never"] == "job needs 5 A100 but tenant team-c can never hold more than 4 (nominal 4 + borrowing 0)"


def test_positions_count_waiting_jobs_of_higher_priority_ahead():
    tenancy = a_cohort(team("team-a", 2), team("team-b", 2))
    snapshot = QuotaSnapshot(tenancy, usage(team_a=2, team_b=2))
    jobs = [a_job(f"h{i}").priority("high").submitted(i).pending() for i in range(12)]
    jobs += [a_job("mine").tenant("team-b").submitted(0).pending()]
    plan = plan_cycle(snapshot, jobs)
    mine = next(w for w in plan.waiting if w.job_id == "mine")
    assert (mine.position, mine.ahead_higher_priority) == (13, 12)
    assert mine.describe() == ("#13 in queue, behind 12 jobs of higher priority: tenant team-b at quota (2/2 A100) "
                               "and cohort has nothing to lend")
    assert [w.position for w in plan.waiting] == list(range(1, 14))


def test_a_candidate_deferred_for_capacity_says_so():
    from gpusched_core.quota import FairShareOrder, QuotaCycle, build_queues

    tenancy = a_cohort(team("team-a", 8))
    snapshot = QuotaSnapshot(tenancy)
    order = FairShareOrder()
    cycle = QuotaCycle(snapshot, build_queues(tenancy, [a_job("j").gpus(8).pending()], order), order)
    candidate = cycle.next_candidate()
    assert candidate is not None
    cycle.defer(candidate)
    plan = cycle.finish()
    assert plan.reservations == () and plan.waiting[0].reason == "fits quota; waiting for capacity"


def test_capacity_freed_by_a_reclaim_is_not_borrowed_back_while_the_owner_waits():
    # team-b borrowed all of team-a's 4; one 2-GPU victim has released: team-a's 4-GPU job still does not
    # fit, and the victim, queued again to resume, must not take the 2 GPUs back as borrowing
    tenancy = a_cohort(team("team-a", 4, borrow=4), team("team-b", 4, borrow=4))
    snapshot = QuotaSnapshot(tenancy, usage(team_b=6))
    owner = a_job("owner").tenant("team-a").gpus(4).pending()
    victim = a_job("victim").tenant("team-b").gpus(2).submitted(5).pending()
    plan = plan_cycle(snapshot, [owner, victim])
    assert reserved(plan) == []
    assert [r.tenant for r in plan.reclaims] == ["team-a"]
    assert waiting(plan)["victim"] == ("cohort capacity of A100 is owed to tenants under their nominal quota: "
                                       "team-a (4); borrowing waits")
    # within its own nominal quota a tenant is never held back by another's claim
    within = a_job("own").tenant("team-b").gpus(2).submitted(6).pending()
    plan = plan_cycle(QuotaSnapshot(tenancy, usage(team_b=2)), [owner, within])
    assert "own" in reserved(plan)
