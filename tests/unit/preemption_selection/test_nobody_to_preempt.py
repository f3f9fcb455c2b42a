"""Deciding a priority preemption from the running jobs' priorities alone (``nobody_to_preempt``): a table of
when it may answer, and a property: whenever it answers ``none``, the whole selection on any cluster finds
nobody to preempt either (it answers ``none`` or ``fits``), with the same reasons when it too says none."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched_core.placement import make_policy
from gpusched_core.preemption import nobody_to_preempt, select_victims

from .builders import a_cluster, a_node, whole

NOW = 5_000.0
POLICY = make_policy("bestfit")


@pytest.mark.parametrize(("priority", "running", "lowest", "stopping", "answers"), [
    (5, 0, None, 0, True),  # nothing runs: nobody to preempt (the cluster decides whether it fits)
    (5, 3, 5, 0, True),  # all of equal priority
    (5, 3, 9, 0, True),  # all higher
    (5, 3, 4, 0, False),  # one lower: only the cluster can tell
    (5, 3, 5, 1, False),  # one is being preempted: the preemptor may await it
    (0, 2, 0, 0, True),
])  # fmt: skip
def test_it_answers_only_when_no_running_job_is_of_lower_priority_and_none_stops(priority, running, lowest, stopping,
                                                                                answers):
    plan = nobody_to_preempt(whole("p", 2, priority=priority), running, lowest, stopping)
    assert (plan is not None) is answers
    if plan is not None:
        assert plan.outcome == "none" and plan.trigger == "priority" and plan.preemptor_id == "p"
        assert plan.reasons[1] == "no running job may be preempted for it"


def test_its_reasons_count_the_running_jobs_it_excluded():
    plan = nobody_to_preempt(whole("p", 1, priority=3), 4, 3, 0)
    assert plan is not None and plan.reasons[2] == "excluded: 4 jobs of equal or higher priority"
    alone = nobody_to_preempt(whole("p", 1, priority=3), 0, None, 0)
    assert alone is not None and alone.reasons[2] == "no running job was excluded"


@st.composite
def clusters_of_equal_or_higher_priority(draw):
    """1-3 nodes of 4 GPUs, some GPUs held by whole-GPU jobs of priority at least the preemptor's."""
    floor = draw(st.integers(0, 5))
    nodes = draw(st.integers(1, 3))
    builder = a_cluster(*(a_node(f"n{i}").gpus(4) for i in range(nodes)))
    serial = 0
    for node in range(nodes):
        for gpu in range(4):
            if draw(st.booleans()):
                serial += 1
                builder.run(f"j{serial:02d}", f"n{node}", (gpu,), priority=draw(st.integers(floor, floor + 3)),
                            started=draw(st.floats(0, NOW, allow_nan=False)))
    return builder, whole("p", draw(st.integers(1, 6)), priority=floor)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters_of_equal_or_higher_priority())
def test_when_it_answers_none_the_whole_selection_finds_nobody_either(scenario):
    builder, preemptor = scenario
    lowest = min((job.priority for job in builder.jobs), default=None)
    quick = nobody_to_preempt(preemptor, len(builder.jobs), lowest, 0)
    assert quick is not None
    full = select_victims(builder.snapshot, preemptor, builder.jobs, NOW, policy=POLICY)
    assert full.outcome in ("none", "fits") and not full.victims
    if full.outcome == "none":
        assert full.reasons[1:] == quick.reasons[1:]
