"""The victim orders are total and deterministic; fewer victims always beat cheaper ones."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.preemption import (
    VICTIM_ORDERS,
    CandidateFacts,
    RunningJob,
    SelectionConfig,
    select_victims,
    set_cost,
)

from .builders import a_cluster, a_node, whole

facts_lists = st.lists(
    st.builds(
        lambda i, priority, started, lost, milli, borrowing: CandidateFacts(
            RunningJob(f"j{i}", "t", priority, started, (f"j{i}",)), milli, lost, borrowing),
        st.integers(0, 10**6), st.integers(0, 3), st.sampled_from([0.0, 10.0, 20.0]), st.sampled_from([0.0, 60.0]),
        st.sampled_from([500, 1000, 2000]), st.booleans(),
    ),
    max_size=12, unique_by=lambda f: f.job.job_id,
)  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(facts_lists, st.randoms(use_true_random=False), st.sampled_from(sorted(VICTIM_ORDERS)))
def test_every_order_sorts_any_permutation_the_same_way(facts, rng, name):
    order = VICTIM_ORDERS[name]
    shuffled = list(facts)
    rng.shuffle(shuffled)
    assert sorted(shuffled, key=order.key) == sorted(facts, key=order.key)
    assert len({order.key(f) for f in facts}) == len(facts)  # total: distinct jobs never tie


def test_default_order_lists_its_criteria_in_order():
    order = VICTIM_ORDERS["default"]
    cheap = CandidateFacts(RunningJob("z", "t", 0, 0.0, ("z",)), 1000, 9999.0, True)
    costly = CandidateFacts(RunningJob("a", "t", 0, 0.0, ("a",)), 1000, 0.0, False)
    assert order.key(cheap) < order.key(costly)  # borrowed usage outranks lost work


def test_fewer_victims_always_beat_cheaper_ones():
    assert set_cost([(9, "x")]) < set_cost([(0, "a"), (0, "b")])
    assert set_cost([(0, "a"), (5, "b")]) < set_cost([(1, "a"), (6, "b")])


def test_past_the_search_caps_the_plan_is_still_minimal_but_not_claimed_exact():
    built = a_cluster(a_node("n1").gpus(8))
    for gpu in range(8):
        built.run(f"s{gpu}a", "n1", (gpu,), milli=500).run(f"s{gpu}b", "n1", (gpu,), milli=500)
    plan = select_victims(built.snapshot, whole("hp", 2), built.jobs, 100.0,
                          config=SelectionConfig(max_combinations_per_node=3))  # fmt: skip
    assert plan.outcome == "preempt" and not plan.exact
    assert len(plan.victims) == 4  # two GPUs, both shares on each
    assert any("search cap reached" in reason for reason in plan.reasons)
