"""Fair backfill in the live cycle (``plan_cycle(..., blocked=, fair_margin=)``): while a tenant's reserved
work waits for room on the nodes, nobody else is reserved past the share at which that work could preempt
it; everyone else, and everything else, goes on as without it."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.quota import BlockedWork, QuotaSnapshot, WaitCategory, plan_cycle, priority_value
from gpusched_core.quota.fairness import backfill_limit, fair_entitlements, fair_share, queue_demand
from gpusched_core.quota.queues import build_queues
from gpusched_core.quota.ordering import FairShareOrder

from .builders import A100, CLASSES, a_cohort, a_job, gpus, team, usage
from .test_properties import TEAMS, scenarios

H100 = "H100"
NORMAL = CLASSES["normal"]

# team-a's 8-GPU job is reserved (its 8 GPUs count) and waits for room; team-a asks 8 more, team-b holds 14
# and asks 1-2 more: the pool of 24 is water-filled 12 / 12 (less team-c's demand), so team-a is at 8 / 12 =
# 0.67 and nobody may backfill past 1.5 x 0.67 = 1.0 of its share; team-b is at 14 / 12 = 1.17 already
TEAMS_ABC = (team("team-a", 8), team("team-b", 8), team("team-c", 8))
HELD = {"team_a": 8, "team_b": 14}
A_WAITS = [BlockedWork("team-a", A100, NORMAL)]
B_JOBS = [("b1", "team-b", 1, "normal"), ("b2", "team-b", 1, "normal")]

SCENARIOS = [
    # (id, jobs (id, tenant, gpus, class), blocked work, margin, reserved, held back by fair share)
    ("b-over-the-limit-is-held-back", B_JOBS, A_WAITS, 0.5, [], ["b1", "b2"]),
    ("nothing-waits-for-room", B_JOBS, [], 0.5, ["b1", "b2"], []),
    ("fair-backfill-off", B_JOBS, A_WAITS, None, ["b1", "b2"], []),
    ("a-tenant-under-the-limit-still-backfills", [("c1", "team-c", 1, "normal"), *B_JOBS], A_WAITS, 0.5,
     ["c1"], ["b1", "b2"]),
    ("a-job-above-the-waiting-works-priority-is-not-held", [("b1", "team-b", 1, "high")], A_WAITS, 0.5, ["b1"], []),
    ("work-of-another-flavor-holds-nothing", B_JOBS, [BlockedWork("team-a", H100, NORMAL)], 0.5, ["b1", "b2"], []),
    ("the-blocked-tenants-own-work-is-not-held", [("a2", "team-a", 1, "normal")], A_WAITS, 0.5, ["a2"], []),
    ("a-wide-margin-lets-b-backfill", B_JOBS, A_WAITS, 1.0, ["b1", "b2"], []),
]


@pytest.mark.parametrize("jobs, blocked, margin, expected, held", [c[1:] for c in SCENARIOS],
                         ids=[c[0] for c in SCENARIOS])
def test_fair_backfill(jobs, blocked, margin, expected, held):
    tenancy = a_cohort(*TEAMS_ABC)
    pending = [a_job(j).tenant(t).gpus(g).priority(k).submitted(i).pending() for i, (j, t, g, k) in enumerate(jobs)]
    pending.append(a_job("a-next").tenant("team-a").gpus(8).submitted(99).pending())  # team-a's demand: 16
    plan = plan_cycle(QuotaSnapshot(tenancy, usage(**HELD)), pending, blocked=blocked, fair_margin=margin)
    assert [r.job_id for r in plan.reservations] == expected
    assert sorted(w.job_id for w in plan.waiting if w.category is WaitCategory.FAIR_SHARE) == held


def test_a_held_back_job_says_whose_wait_holds_it_and_by_how_much():
    tenancy = a_cohort(*TEAMS_ABC)
    pending = [a_job("b1").tenant("team-b").pending(), a_job("a-next").tenant("team-a").gpus(8).pending()]
    plan = plan_cycle(QuotaSnapshot(tenancy, usage(**HELD)), pending, blocked=A_WAITS, fair_margin=0.5)
    [why] = [w.reason for w in plan.waiting if w.job_id == "b1"]
    assert why == ("fair share: tenant team-b would reach 1.25 of its fair share, past 1.00, while a job of "
                   "tenant team-a that fits its quota waits for room on the nodes (no backfill past the share "
                   "at which that job could preempt it)")


def test_a_blocked_tenant_past_its_entitlement_holds_nobody_back():
    tenancy = a_cohort(*TEAMS_ABC)
    pending = [a_job("b1").tenant("team-b").pending()]  # team-a holds 16 and asks nothing more: entitled 8 + ...
    plan = plan_cycle(QuotaSnapshot(tenancy, usage(team_a=16, team_b=6)), pending, blocked=A_WAITS, fair_margin=0.5)
    assert [r.job_id for r in plan.reservations] == ["b1"]


@settings(max_examples=150, deadline=None)
@given(scenarios(), st.lists(st.tuples(st.sampled_from(TEAMS), st.sampled_from(sorted(CLASSES))), max_size=3),
       st.sampled_from([0.0, 0.5, 1.0]))
def test_no_reservation_takes_a_tenant_past_the_limit_of_work_waiting_for_room(scenario, waits, margin):
    snapshot, pending = scenario
    blocked = [BlockedWork(t, A100, CLASSES[k]) for t, k in waits]
    plan = plan_cycle(snapshot, pending, blocked=blocked, fair_margin=margin)
    plain = plan_cycle(snapshot, pending)
    if not blocked:
        assert plan.reservations == plain.reservations
    tenancy = snapshot.tenancy
    entitled = fair_entitlements(snapshot, queue_demand(snapshot, build_queues(tenancy, pending, FairShareOrder())))
    limits = {(w.tenant, w.priority): backfill_limit(snapshot, entitled, w.tenant, A100, 0, margin) for w in blocked}
    jobs = {job.job_id: job for job in pending}
    given_units: dict[str, int] = {}
    for r in plan.reservations:  # in the order the cycle made them
        given_units[r.tenant] = given_units.get(r.tenant, 0) + r.units
        priority = priority_value(tenancy, jobs[r.job_id])
        limit = min((v for (t, p), v in limits.items() if t != r.tenant and p >= priority), default=math.inf)
        assert fair_share(snapshot, r.tenant, entitled, {A100: given_units[r.tenant]}) <= limit + 1e-9
    held = [w for w in plan.waiting if w.category is WaitCategory.FAIR_SHARE]
    assert all(w.tenant not in {t for t, _ in waits} or len({t for t, _ in waits}) > 1 for w in held)
    assert len(plan.reservations) + len(plan.waiting) == len(pending)
