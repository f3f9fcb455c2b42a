"""Properties: quota is never exceeded, the order is total and deterministic, cycles agree with it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.quota import (
    FairShareOrder,
    QuotaBook,
    QuotaCycle,
    QuotaSnapshot,
    UsageHistory,
    build_queues,
    order_pending,
    plan_cycle,
)

from .builders import A100, a_job, gpus, org, team, tenancy_of

TEAMS = ("t0", "t1", "t2", "t3", "t4", "t5")
maybe_limit = st.one_of(st.none(), st.integers(0, 12))


@st.composite
def tenancies(draw):
    """Two organisations of up to three teams each, under one root, with random limits."""
    teams = []
    for name in TEAMS:
        nominal = draw(st.integers(0, 12))
        lend = draw(st.one_of(st.none(), st.integers(0, nominal)))
        teams.append(team(name, nominal, borrow=draw(maybe_limit), lend=lend, weight=draw(st.sampled_from([1, 2]))))
    roots = [org("root", org("org-a", *teams[:3], borrow=draw(maybe_limit), lend=draw(maybe_limit)),
                 org("org-b", *teams[3:], borrow=draw(maybe_limit)))]
    return tenancy_of(roots, half_life_s=draw(st.sampled_from([0.0, 3600.0])))


@st.composite
def scenarios(draw):
    tenancy = draw(tenancies())
    # start from usage that itself respects quota: reserve random jobs through the planner
    seed_jobs = [a_job(f"s{i}").tenant(draw(st.sampled_from(TEAMS))).gpus(draw(st.integers(1, 6))).pending()
                 for i in range(draw(st.integers(0, 12)))]
    usage = plan_cycle(QuotaSnapshot(tenancy), seed_jobs).usage
    classes = st.sampled_from(["high", "normal", "low"])
    pending = [a_job(f"j{i}").tenant(draw(st.sampled_from(TEAMS))).gpus(draw(st.integers(1, 8)))
               .priority(draw(classes)).submitted(draw(st.integers(0, 5))).pending()
               for i in range(draw(st.integers(0, 25)))]
    history = {t: UsageHistory(0.0, {A100: draw(st.floats(0, 1e5))}) for t in TEAMS}
    return QuotaSnapshot(tenancy, usage, history, now_s=draw(st.floats(0, 1e4))), pending


def within_quota(snapshot: QuotaSnapshot, usage) -> bool:
    tenancy, tree = snapshot.tenancy, snapshot.tenancy.tree
    book = QuotaBook.from_usage(tenancy, usage)
    for name in tenancy.leaves():
        spec = tenancy.tenants[name].flavor_quota(A100)
        if spec.borrowing_limit is not None and book.used(name, A100) > spec.nominal + spec.borrowing_limit:
            return False
    for name in tenancy.tenants:  # every cohort (inner node) lends at most what its members put in
        i = tree.index[name]
        if tree.parent[i] < 0 and book.used(name, A100) > tree.pool[A100][i]:
            return False
        cap = tree.borrow_cap[A100][i]
        g = tree.guaranteed[A100][i]
        if tree.parent[i] >= 0 and cap is not None and max(0, book.used(name, A100) - g) > tree.pool[A100][i] - g + cap:
            return False
    return True


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_reservations_never_exceed_nominal_plus_borrowing_nor_what_the_cohort_has(scenario):
    snapshot, pending = scenario
    assert within_quota(snapshot, snapshot.usage)
    plan = plan_cycle(snapshot, pending)
    assert within_quota(snapshot, plan.usage)
    assert {r.job_id for r in plan.reservations}.isdisjoint(w.job_id for w in plan.waiting)
    assert len(plan.reservations) + len(plan.waiting) == len(pending)


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_the_order_and_the_plan_do_not_depend_on_input_order(scenario, rnd):
    snapshot, pending = scenario
    shuffled = list(pending)
    rnd.shuffle(shuffled)
    assert order_pending(snapshot, pending) == order_pending(snapshot, shuffled)
    assert plan_cycle(snapshot, pending) == plan_cycle(snapshot, shuffled)
    assert sorted(order_pending(snapshot, pending)) == sorted(j.job_id for j in pending)


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_a_cycle_visits_jobs_in_the_documented_order(scenario):
    snapshot, pending = scenario
    order = FairShareOrder()
    cycle = QuotaCycle(snapshot, build_queues(snapshot.tenancy, pending, order), order)
    while (candidate := cycle.next_candidate()) is not None:
        cycle.defer(candidate)  # reserve nothing: every job stays waiting, in order
    plan = cycle.finish()
    assert [w.job_id for w in plan.waiting] == order_pending(snapshot, pending)


@settings(max_examples=60, deadline=None)
@given(scenarios())
def test_explained_and_fast_cycles_reserve_the_same_and_request_the_same_reclaims(scenario):
    snapshot, pending = scenario
    fast, full = plan_cycle(snapshot, pending, explain=False), plan_cycle(snapshot, pending)
    assert fast.reservations == full.reservations
    assert fast.reclaims == full.reclaims
    assert fast.waiting == ()


def test_a_reclaim_never_asks_for_more_than_the_tenant_is_owed():
    from .builders import a_cohort, usage

    tenancy = a_cohort(team("team-a", 4), team("team-b", 4))
    jobs = [a_job(f"j{i}").gpus(1).submitted(i).pending() for i in range(10)]
    [request] = plan_cycle(QuotaSnapshot(tenancy, usage(team_b=8)), jobs).reclaims
    assert request.units == gpus(4) and len(request.for_jobs) == 4
