"""Properties over random small clusters: victims sufficient, minimal and the fewest; never of equal or
higher priority; the plan independent of the order jobs are listed in; no preemption that cannot help."""

from __future__ import annotations

from dataclasses import replace
from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched_core.placement import RequestId, make_policy, place
from gpusched_core.preemption import released, reserve, select_victims

from .builders import a_cluster, a_node, share, whole

NOW = 5_000.0
POLICY = make_policy("bestfit")


@st.composite
def scenarios(draw):
    """1-3 nodes of 4 GPUs, filled by whole-GPU and shared jobs of random priority; one preemptor."""
    node_count = draw(st.integers(1, 3))
    builder = a_cluster(*(a_node(f"n{i}").gpus(4) for i in range(node_count)))
    serial = 0
    for node in range(node_count):
        for gpu in range(4):
            kind = draw(st.sampled_from(["free", "whole", "shares"]))
            shares = st.lists(st.sampled_from([200, 300, 500]), min_size=1, max_size=2)
            jobs = [] if kind == "free" else [1000] if kind == "whole" else draw(shares)
            for milli in jobs:
                serial += 1
                started = draw(st.floats(0, NOW, allow_nan=False))
                checkpoint = draw(st.one_of(st.none(), st.floats(started, NOW, allow_nan=False)))
                builder.run(f"j{serial:02d}", f"n{node}", (gpu,), milli=milli, priority=draw(st.integers(0, 3)),
                            started=started, checkpoint=checkpoint)  # fmt: skip
    preemptor = draw(st.one_of(
        st.builds(lambda c, p: whole("p", c, priority=p), st.integers(1, 4), st.integers(0, 4)),
        st.builds(lambda m, p: share("p", m, priority=p), st.sampled_from([300, 600, 900]), st.integers(0, 4)),
    ))  # fmt: skip
    return builder, preemptor


def fits_without(builder, preemptor, job_ids) -> bool:
    ids = [a for job in builder.jobs if job.job_id in job_ids for a in job.allocation_ids]
    return place(released(builder.snapshot, ids), preemptor.request, POLICY).placed


PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(scenarios())
def test_victims_are_sufficient_minimal_fewest_and_of_lower_priority(scenario):
    builder, preemptor = scenario
    plan = select_victims(builder.snapshot, preemptor, builder.jobs, NOW, policy=POLICY)
    lower = [job.job_id for job in builder.jobs if job.priority < preemptor.priority]
    if plan.outcome == "fits":
        assert fits_without(builder, preemptor, [])
        return
    sizes = range(len(lower) + 1)
    smallest = next((n for n in sizes if any(fits_without(builder, preemptor, set(c)) for c in combinations(lower, n))),
                    None)  # fmt: skip
    if plan.outcome == "none":
        assert smallest is None  # no preemption when no allowed set would let it run
        return
    assert plan.outcome == "preempt"
    ids = set(plan.victim_ids)
    assert all(v.priority < preemptor.priority for v in plan.victims)
    assert fits_without(builder, preemptor, ids)
    assert all(not fits_without(builder, preemptor, ids - {v}) for v in ids)
    assert plan.exact and len(ids) == smallest


@PROPERTY_SETTINGS
@given(scenarios(), st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_the_order_jobs_are_listed_in(scenario, rng):
    builder, preemptor = scenario
    first = select_victims(builder.snapshot, preemptor, builder.jobs, NOW, policy=POLICY)
    shuffled = list(builder.jobs)
    rng.shuffle(shuffled)
    again = select_victims(builder.snapshot, preemptor, shuffled, NOW, policy=POLICY)
    assert again == first


@PROPERTY_SETTINGS
@given(scenarios())
def test_a_reserved_slot_is_never_counted_twice(scenario):
    builder, preemptor = scenario
    plan = select_victims(builder.snapshot, preemptor, builder.jobs, NOW, policy=POLICY)
    if plan.outcome != "preempt":
        return
    after = reserve(builder.snapshot, plan)
    assert preemptor.request.id in after.allocations
    remaining = [job for job in builder.jobs if job.job_id not in plan.victim_ids]
    second = replace(preemptor, job_id="p2", request=replace(preemptor.request, id=RequestId("p2")))
    again = select_victims(after, second, remaining, NOW, policy=POLICY)
    if again.outcome == "preempt":
        assert not set(again.victim_ids) & set(plan.victim_ids)
        assert again.placement is not None
        reserve(after, again)  # raises PlacementError if the two slots overlapped
