"""The fair entitlement, the deficit share the fair-share order ranks by, and the fair-share
preemption rule (``gpusched_core.quota.fairness``)."""

from __future__ import annotations

import math

import pytest

from gpusched_core.quota import QuotaSnapshot, UsageHistory
from gpusched_core.quota.fairness import (
    backfill_limit,
    fair_entitlements,
    fair_share,
    fair_shares,
    fair_victim_tenants,
)

from .builders import A100, a_cohort, gpus, team, usage


def demand(**per_tenant: float) -> dict[tuple[str, str], float]:
    return {(name.replace("_", "-"), A100): gpus(n) for name, n in per_tenant.items()}


def in_gpus(entitled: dict) -> dict[str, float]:
    return {tenant: round(units / gpus(1), 3) for (tenant, _), units in entitled.items()}


def test_an_idle_tenants_share_goes_to_the_others_by_weight_and_nobody_gets_more_than_it_asks():
    tenancy = a_cohort(team("team-a", 8, weight=2), team("team-b", 8), team("team-c", 8))
    entitled = fair_entitlements(QuotaSnapshot(tenancy), demand(team_a=30, team_b=30, team_c=2))
    assert in_gpus(entitled) == {"team-a": 14.667, "team-b": 7.333, "team-c": 2.0}


def test_a_tenant_that_asks_for_its_nominal_quota_is_entitled_to_all_of_it():
    tenancy = a_cohort(team("team-a", 4), team("team-b", 12))
    entitled = fair_entitlements(QuotaSnapshot(tenancy), demand(team_a=4, team_b=100))
    assert in_gpus(entitled) == {"team-a": 4.0, "team-b": 12.0}


def test_the_borrowing_limit_caps_the_entitlement():
    tenancy = a_cohort(team("team-a", 4, borrow=2), team("team-b", 12))
    entitled = fair_entitlements(QuotaSnapshot(tenancy), demand(team_a=16, team_b=1))
    assert in_gpus(entitled) == {"team-a": 6.0, "team-b": 1.0}


def test_a_tenant_without_nominal_quota_is_weighed_as_one_gpu():
    tenancy = a_cohort(team("team-a", 15), team("guests", 0))
    entitled = fair_entitlements(QuotaSnapshot(tenancy), demand(team_a=100, guests=100))
    assert in_gpus(entitled) == {"team-a": 14.062, "guests": 0.938}


def test_the_share_is_the_larger_of_what_a_tenant_holds_and_what_it_used_recently():
    tenancy = a_cohort(team("team-a", 8), team("team-b", 8), half_life_s=3600)
    rate_4 = UsageHistory(0.0, {A100: 4 * 3600 / 0.6931471805599453})  # an average of 4 GPUs
    entitled = {("team-a", A100): gpus(8), ("team-b", A100): gpus(8)}
    held_2 = QuotaSnapshot(tenancy, usage(team_a=2), {"team-a": rate_4})
    held_6 = QuotaSnapshot(tenancy, usage(team_a=6), {"team-a": rate_4})
    assert fair_share(held_2, "team-a", entitled) == pytest.approx(0.5)
    assert fair_share(held_6, "team-a", entitled) == pytest.approx(0.75)


def test_a_burst_is_not_ranked_ahead_of_the_same_share_held_steadily():
    tenancy = a_cohort(team("team-a", 8), team("team-b", 8), half_life_s=3600)
    rate_6 = UsageHistory(0.0, {A100: 6 * 3600 / 0.6931471805599453})
    snapshot = QuotaSnapshot(tenancy, usage(team_b=6), {"team-a": rate_6, "team-b": rate_6})
    shares = fair_shares(snapshot, demand(team_a=7, team_b=7))
    assert shares["team-a"] == pytest.approx(shares["team-b"])  # idle now, but used 6 GPUs lately


def test_fair_share_preemption_takes_only_from_tenants_well_over_the_preemptors_share():
    tenancy = a_cohort(team("team-a", 8), team("team-b", 8), team("team-c", 8))
    snapshot = QuotaSnapshot(tenancy, usage(team_b=14, team_c=9))
    want = demand(team_a=4, team_b=20, team_c=20)
    entitled = fair_entitlements(snapshot, want)  # a 4, b 10, c 10
    shares = fair_shares(snapshot, want)  # a 0, b 1.4, c 0.9
    # team-a's 2-GPU job leaves it at 0.5 of its entitlement
    assert fair_victim_tenants(snapshot, shares, entitled, "team-a", A100, gpus(2), 0.5) == {"team-b", "team-c"}
    assert fair_victim_tenants(snapshot, shares, entitled, "team-a", A100, gpus(2), 1.0) == {"team-b"}
    # team-c's 1-GPU job takes it to exactly its entitlement
    assert fair_victim_tenants(snapshot, shares, entitled, "team-c", A100, gpus(1), 0.2) == {"team-b"}
    assert fair_victim_tenants(snapshot, shares, entitled, "team-c", A100, gpus(1), 0.5) == frozenset()


def test_no_fair_share_preemption_for_a_job_that_takes_its_tenant_past_its_entitlement():
    tenancy = a_cohort(team("team-a", 1), team("team-b", 15))
    snapshot = QuotaSnapshot(tenancy, usage(team_b=16))
    want = demand(team_a=8, team_b=30)
    shares = fair_shares(snapshot, want)
    entitled = fair_entitlements(snapshot, want)  # a 1 GPU: its 8-GPU job would be 8 times that
    assert fair_victim_tenants(snapshot, shares, entitled, "team-a", A100, gpus(8), 0.0) == frozenset()



def test_no_tenant_may_backfill_past_the_share_at_which_a_job_waiting_for_room_could_preempt_it():
    tenancy = a_cohort(team("team-a", 8), team("team-b", 8), team("team-c", 8))
    snapshot = QuotaSnapshot(tenancy, usage(team_b=14, team_c=9))
    want = demand(team_a=4, team_b=20, team_c=20)
    entitled, shares = fair_entitlements(snapshot, want), fair_shares(snapshot, want)  # shares a 0, b 1.4, c 0.9
    limit = backfill_limit(snapshot, entitled, "team-a", A100, gpus(2), 1.0)  # team-a at 0.5 once it runs
    assert limit == pytest.approx(1.0)
    preemptible = fair_victim_tenants(snapshot, shares, entitled, "team-a", A100, gpus(2), 1.0)
    assert preemptible == {t for t, share in shares.items() if share > limit} == {"team-b"}
    assert backfill_limit(snapshot, entitled, "team-a", A100, gpus(8), 0.0) == math.inf  # past its 4
