"""The optimised planner decides exactly as the planner before its performance work (``reference_planner``):
same reservations, waiting jobs (order, positions, reasons), reclaim requests and usage, same queue order,
and the same candidates for a caller that defers some of them, on random tenancies and pending work."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.quota import (
    UNITS_PER_GPU,
    FairShareOrder,
    FifoOrder,
    PendingJob,
    QuotaAsk,
    QuotaCycle,
    QuotaSnapshot,
    UsageHistory,
    build_queues,
    order_pending,
    parse_tenancy,
    plan_cycle,
)

from . import reference_planner as reference
from .builders import CLASSES

FLAVORS = ("A100", "H100")
TEAMS = ("t0", "t1", "t2", "t3", "t4")
limits = st.one_of(st.none(), st.integers(0, 10))


@st.composite
def tenancies(draw):
    """Two organisations under one root; teams with quota of one or both flavors, some of them allowed
    only some priority classes."""
    teams = []
    for name in TEAMS:
        quota = {f: {"nominal": draw(st.integers(0, 10)), "borrowing_limit": draw(limits)}
                 for f in FLAVORS if draw(st.booleans()) or f == FLAVORS[0]}
        doc = {"name": name, "weight": draw(st.sampled_from([1.0, 2.0])), "quota": quota}
        if draw(st.booleans()):
            doc["priority_classes"] = sorted(draw(st.sets(st.sampled_from(sorted(CLASSES)), min_size=1)))
        teams.append(doc)
    roots = [{"name": "root", "children": [{"name": "org-a", "children": teams[:2]},
                                          {"name": "org-b", "children": teams[2:]}]}]
    return parse_tenancy({"version": 1, "priority_classes": CLASSES, "default_priority_class": "normal",
                          "fair_share": {"half_life_s": draw(st.sampled_from([0.0, 3600.0]))}, "tenants": roots})


def asks():
    option = st.tuples(st.sampled_from(FLAVORS), st.sampled_from([UNITS_PER_GPU // 2, UNITS_PER_GPU,
                                                                  2 * UNITS_PER_GPU, 4 * UNITS_PER_GPU]))
    return st.lists(option, min_size=1, max_size=2, unique_by=lambda o: o[0]).map(lambda o: QuotaAsk(tuple(o)))


@st.composite
def pending(draw, prefix: str, most: int):
    tenants = st.sampled_from((*TEAMS, "ghost", "org-a"))  # an unknown tenant and an inner node
    classes = st.sampled_from((*sorted(CLASSES), "bogus"))
    return [PendingJob(f"{prefix}{i}", draw(tenants), draw(asks()), draw(classes), float(draw(st.integers(0, 4))),
                       draw(st.integers(0, 1)))
            for i in range(draw(st.integers(0, most)))]


@st.composite
def scenarios(draw):
    tenancy = draw(tenancies())
    seed = draw(pending("s", 10))
    usage = reference.plan_cycle(QuotaSnapshot(tenancy), seed).usage  # usage that itself respects quota
    history = {t: UsageHistory(0.0, {f: draw(st.floats(0, 1e5)) for f in FLAVORS}) for t in TEAMS}
    snapshot = QuotaSnapshot(tenancy, usage, history, now_s=draw(st.floats(0, 1e4)))
    return snapshot, draw(pending("j", 30)), draw(st.sampled_from([FairShareOrder(), FifoOrder()]))


def same(plan, old) -> bool:
    """The live plan decides as the reference one: every field, the waiting jobs ranked, and each
    waiting job's unordered reason the same as its ranked one."""
    reasons = sorted((job.job_id, category, reason) for job, category, reason in plan.reasons())
    return ((plan.order, plan.reservations, plan.waiting, plan.reclaims, plan.usage)
            == (old.order, old.reservations, old.waiting, old.reclaims, old.usage)
            and reasons == sorted((w.job_id, w.category, w.reason) for w in old.waiting))


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.booleans())
def test_plans_and_queue_order_are_those_of_the_reference_planner(scenario, explain):
    snapshot, jobs, order = scenario
    assert same(plan_cycle(snapshot, jobs, order, explain=explain),
                reference.plan_cycle(snapshot, jobs, order, explain=explain))
    assert order_pending(snapshot, jobs, order) == reference.order_pending(snapshot, jobs, order)
    assert build_queues(snapshot.tenancy, jobs, order) == reference.build_queues(snapshot.tenancy, jobs, order)


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.lists(st.booleans(), min_size=1, max_size=8), st.booleans())
def test_a_caller_that_defers_some_candidates_sees_the_reference_candidates(scenario, defer_pattern, explain):
    snapshot, jobs, order = scenario
    plans, seen = [], []
    for module in (None, reference):
        cycle_class = QuotaCycle if module is None else reference.QuotaCycle
        queues = build_queues(snapshot.tenancy, jobs, order)
        cycle = cycle_class(snapshot, queues, order, explain=explain)
        visited, step = [], 0
        while (candidate := cycle.next_candidate()) is not None:
            visited.append((candidate.job.job_id, candidate.flavor, candidate.units))
            if defer_pattern[step % len(defer_pattern)]:
                cycle.defer(candidate)
            else:
                cycle.reserve(candidate)
            step += 1
        seen.append(visited)
        plans.append(cycle.finish())
    assert seen[0] == seen[1]
    assert same(*plans)
