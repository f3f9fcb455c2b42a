"""Fair-share preemption for a job that holds quota and waits for room (``preemption.fairshare``): whom it may
take runs from and how much of each, and the victims the selection core then picks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.placement import PodRequest, RequestId, WholeGpus
from gpusched_core.preemption import Preemptor, SelectionConfig, select_victims
from gpusched_core.preemption.fairshare import fair_share_trigger
from gpusched_core.quota import UNITS_PER_GPU, QuotaSnapshot
from gpusched_core.quota.fairness import fair_entitlements, fair_share

from ..quota_policy.builders import A100, a_cohort, team
from .builders import a_cluster, a_node

U = UNITS_PER_GPU
TENANCY = a_cohort(team("a", 8), team("b", 8), team("c", 8))
NOW_S = 10_000.0
CONFIG = SelectionConfig(default_min_runtime_s=600.0, fair_share_enabled=True)


def snapshot(**held: float) -> QuotaSnapshot:
    return QuotaSnapshot(TENANCY, {t: {A100: int(g * U)} for t, g in held.items()}, {}, NOW_S)


def demand(**gpus: float) -> dict[tuple[str, str], float]:
    return {(t, A100): g * U for t, g in gpus.items()}


# a holds 4 (its waiting job's) and asks 8 more, b holds 14 and asks 10 more, c holds 6: entitled 9 / 9 / 6,
# so a is at 0.44, b at 1.56 and c at 1.0; with the margin 0.5 both b and c are over 0.67, but c is within
# its nominal 8 (it loses nothing), and b may lose 6 GPUs (what it borrows; keeping 1.56 -> 0.89 above 0.44)
HELD = {"a": 4, "b": 14, "c": 6}
WANT = {"a": 12, "b": 24, "c": 6}


def test_the_waiting_tenant_may_take_only_from_tenants_over_the_margin_and_only_what_they_borrow():
    trigger = fair_share_trigger(snapshot(**HELD), demand(**WANT), "a", A100, 4 * U, 0.5)
    assert trigger is not None and sorted(trigger.usage_units) == ["a", "b"]
    final = 4 / 9
    budget = trigger.usage_units["b"] - final * trigger.weights["b"]
    assert budget == pytest.approx(6 * U)
    assert trigger.usage_units["a"] + 4 * U == 4 * U  # the core adds the job back: a's share once it runs


@pytest.mark.parametrize("held, want, margin", [
    pytest.param({"a": 10, "b": 14}, {"a": 10, "b": 24}, 0.5, id="the-waiting-tenant-is-past-its-entitlement"),
    pytest.param(HELD, WANT, 3.0, id="nobody-is-over-the-margin"),
    pytest.param({"a": 4, "b": 8, "c": 8}, {"a": 12, "b": 12, "c": 12}, 0.5, id="nobody-borrows"),
])
def test_no_trigger(held, want, margin):
    assert fair_share_trigger(snapshot(**held), demand(**want), "a", A100, 4 * U, margin) is None


def test_the_core_takes_the_fewest_runs_of_the_tenant_over_its_share_never_one_within_its_quota():
    # a's 4 GPUs fit nowhere: n2 and n3 have 2 free each; c2 on n3 would make room as well as b4 on n2
    cluster = (a_cluster(a_node("n1").gpus(8, A100), a_node("n2").gpus(8, A100), a_node("n3").gpus(8, A100))
               .run("b1", "n1", (0, 1, 2, 3), tenant="b", units=4 * U)
               .run("b2", "n1", (4, 5, 6, 7), tenant="b", units=4 * U)
               .run("b3", "n2", (0, 1, 2, 3), tenant="b", units=4 * U).run("b4", "n2", (4, 5), tenant="b", units=2 * U)
               .run("c1", "n3", (0, 1, 2, 3), tenant="c", units=4 * U).run("c2", "n3", (4, 5), tenant="c", units=2 * U))
    trigger = fair_share_trigger(snapshot(**HELD), demand(**WANT), "a", A100, 4 * U, 0.5)
    me = Preemptor("a-wait", "a", 0, PodRequest(RequestId("a-wait"), WholeGpus(4)), 4 * U)
    plan = select_victims(cluster.snapshot, me, cluster.jobs, NOW_S, trigger=trigger, config=CONFIG)
    assert plan.outcome == "preempt" and plan.victim_ids == ("b4",), plan.reasons
    assert plan.victims[0].reason.startswith("preempted for job a-wait of priority 0 in tenant a, because tenant b "
                                             "is above its fair share")
    young = select_victims(cluster.snapshot, me, cluster.jobs, 500.0, trigger=trigger, config=CONFIG)
    assert young.outcome == "none"  # every run is younger than the quantum


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({t: st.integers(0, 16) for t in "abc"}),
       st.fixed_dictionaries({t: st.integers(0, 16) for t in "abc"}), st.integers(1, 8),
       st.sampled_from([0.0, 0.5, 1.0]))
def test_no_tenant_may_lose_past_its_nominal_quota_or_below_the_waiting_tenants_share(held, more, units, margin):
    held = {**held, "a": max(held["a"], units)}  # a's waiting job is among what it holds
    state = snapshot(**held)
    want = demand(**{t: held[t] + more[t] for t in held})
    trigger = fair_share_trigger(state, want, "a", A100, units * U, margin)
    if trigger is None:
        return
    entitled = fair_entitlements(state, want)
    final = held["a"] * U / entitled[("a", A100)]
    for name in set(trigger.usage_units) - {"a"}:
        budget = trigger.usage_units[name] - final * trigger.weights[name]
        assert 0 < budget <= held[name] * U - TENANCY.nominal_units(name, A100) + 1e-6
        assert (held[name] * U - budget) / entitled[(name, A100)] >= final - 1e-9
        assert fair_share(state, name, entitled) > fair_share(state, "a", entitled) * (1 + margin)
