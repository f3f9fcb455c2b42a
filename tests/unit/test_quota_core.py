"""The quota service's pure glue: job shapes charged in quota units, guests, the order of waiting work,
reclaims sent without flooding, operators' tenancy updates reviewed, the local stack's tenancy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_common import events as ev
from gpusched_common.identity import OPERATOR, Verdict
from gpusched_cli.stack import local_tenancy, node_specs
from gpusched_core.quota import UNITS_PER_GPU, QuotaSnapshot, ReclaimRequest, parse_tenancy, plan_cycle
from gpusched_core.quota.reclaims import SentReclaim, reclaim_event, select_reclaims
from gpusched_core.quota.jobs import UsageLimits, as_guest, chargeable, cohort_of, limits_in_force, queued_job, to_pending
from services.quota.core import Accepted, Rejected, review_update
from tests.builders import T0

A100, H100 = "A100-80GB", "H100-80GB"


def tenancy(guest: str | None = "guests", revision: int = 1):
    doc = {"version": 1, "revision": revision, "flavors": [H100, A100], "priority_classes": {"high": 100, "batch": 0},
           "default_priority_class": "batch", "units": {"mig_slices_per_gpu": {A100: 7}},
           "tenants": [{"name": "org", "children": [
               {"name": "team-a", "quota": {A100: {"nominal": 8}, H100: {"nominal": 4}}},
               {"name": "team-b", "quota": {A100: {"nominal": 8}}},
               {"name": "guests", "quota": {A100: {"nominal": 2}}}]}]}
    if guest is not None:
        doc["guest_tenant"] = guest
    return parse_tenancy(doc)


def spec(tenant: str = "team-a", gpus: int = 1, model: str | None = A100, **shape) -> ev.JobSpec:
    return ev.JobSpec(tenant=tenant, gpus=gpus, gpu_model=model, command=["true"], **shape)


def charged(job_spec: ev.JobSpec, t=None):
    pending = to_pending(t or tenancy(), queued_job("j", job_spec, 0.0))
    assert not isinstance(pending, str), pending
    return pending.tenant, pending.ask.options


# --- job shapes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("job_spec, options", [
    (spec(gpus=4), ((A100, 4 * UNITS_PER_GPU),)),
    (spec(gpus=8, nodes=2), ((A100, 16 * UNITS_PER_GPU),)),  # a gang: every node's GPUs
    (spec(gpu_share=ev.GpuShareSpec(milli=250, memory_mib=8000)), ((A100, UNITS_PER_GPU // 4),)),
    (spec(mig_profile="3g.40gb"), ((A100, 3 * UNITS_PER_GPU // 7),)),
    (spec(gpus=2, model=None), ((H100, 2 * UNITS_PER_GPU), (A100, 2 * UNITS_PER_GPU))),  # own quota first
], ids=["whole", "gang", "share", "mig", "any-model"])
def test_every_job_shape_is_charged_in_quota_units(job_spec, options):
    assert charged(job_spec) == ("team-a", options)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["team-a", "team-b", "someone-new", "org"]), st.sampled_from([1, 2, 8]),
                          st.sampled_from([A100, H100, None]), st.sampled_from([0, 100, 7]),
                          st.sampled_from([None, "3g.40gb", "big"])), max_size=30))
def test_a_queue_is_charged_as_each_job_would_be_alone(shapes):
    # chargeable works each shape out once: the same as converting every job on its own
    t = tenancy()
    queued = [queued_job(f"j{i}", spec(tenant, gpus, model, priority=priority, mig_profile=mig), float(i))
              for i, (tenant, gpus, model, priority, mig) in enumerate(shapes)]
    alone = [(job.job_id, to_pending(t, job)) for job in queued]
    pending, refused = chargeable(t, queued)
    assert pending == [p for _, p in alone if not isinstance(p, str)]
    assert refused == [(j, p) for j, p in alone if isinstance(p, str)]


def test_a_request_that_cannot_be_charged_says_why():
    reason = to_pending(tenancy(), queued_job("j", spec(mig_profile="big"), 0.0))
    assert reason == "job cannot be charged to quota: unknown MIG profile 'big': expected a name like '3g.40gb'"


# --- guests and unknown tenants ---------------------------------------------------------------------


def test_a_tenant_the_file_does_not_name_is_charged_to_the_guest_tenant_and_told_so():
    t = tenancy()
    assert charged(spec(tenant="someone-new"), t)[0] == "guests"
    assert cohort_of(t, "someone-new") == "org"
    job = queued_job("j", spec(tenant="someone-new"), 0.0)
    assert as_guest(t, job, "tenant guests at quota (2/2 A100-80GB) and cohort has nothing to lend") == (
        "tenant guests at quota (2/2 A100-80GB) and cohort has nothing to lend"
        " (tenant someone-new is not in the tenancy file; charged to guests)")


def test_without_a_guest_tenant_an_unknown_tenant_waits_with_a_reason():
    t = tenancy(guest=None)
    pending = to_pending(t, queued_job("j", spec(tenant="someone-new"), 0.0))
    plan = plan_cycle(QuotaSnapshot(t, {}), [pending])
    assert plan.reservations == ()
    assert plan.waiting[0].reason == "tenant someone-new is not in the tenancy file"
    assert cohort_of(t, "someone-new") == "someone-new"


@pytest.mark.parametrize("guest, problem", [
    ("nobody", "guest_tenant: 'nobody' is not a tenant of this file"),
    ("org", "guest_tenant: 'org' is an organisation; name a team"),
])
def test_the_guest_tenant_must_be_a_team_of_the_file(guest, problem):
    from gpusched_core.quota import TenancyError

    with pytest.raises(TenancyError, match=problem):
        tenancy(guest=guest)


# --- the order of waiting work -----------------------------------------------------------------------


def test_earlier_submissions_go_first_whatever_order_they_arrived_in():
    t = tenancy()
    late = queued_job("late", spec(gpus=8), (T0 + timedelta(seconds=1)).timestamp())
    early = queued_job("early", spec(gpus=8), T0.timestamp())
    snapshot = QuotaSnapshot(t, {"team-b": {A100: 8 * UNITS_PER_GPU}})
    plan = plan_cycle(snapshot, [to_pending(t, late), to_pending(t, early)])
    assert [r.job_id for r in plan.reservations] == ["early"]


def test_a_job_larger_than_the_tenant_can_ever_hold_does_not_block_the_others():
    t = tenancy()
    huge = queued_job("huge", spec(gpus=20), 0.0)
    small = queued_job("small", spec(gpus=2), 1.0)
    plan = plan_cycle(QuotaSnapshot(t, {}), [to_pending(t, huge), to_pending(t, small)])
    assert [r.job_id for r in plan.reservations] == ["small"]
    assert plan.waiting[0].reason.startswith("job needs 20 A100-80GB but tenant team-a can never hold more than 18")


def test_a_spec_priority_with_a_class_of_that_value_goes_first():
    t = tenancy()
    low = queued_job("low", spec(gpus=18), 0.0)
    high = queued_job("high", spec(gpus=18, priority=100), 1.0)
    plan = plan_cycle(QuotaSnapshot(t, {}), [to_pending(t, low), to_pending(t, high)])
    assert [r.job_id for r in plan.reservations] == ["high"]


# --- reclaims ---------------------------------------------------------------------------------------

REQUEST = ReclaimRequest("team-a", A100, 4 * UNITS_PER_GPU, ("j1", "j2"), (("team-b", 6 * UNITS_PER_GPU),))


@pytest.mark.parametrize("sent, now_s, expected", [
    ({}, 100.0, True),
    ({("team-a", A100): SentReclaim(frozenset({"j1", "j2"}), 90.0)}, 100.0, False),  # the same, just sent
    ({("team-a", A100): SentReclaim(frozenset({"j1", "j2", "j0"}), 90.0)}, 100.0, False),  # already covered
    ({("team-a", A100): SentReclaim(frozenset({"j1"}), 90.0)}, 100.0, True),  # j2 is new
    ({("team-a", A100): SentReclaim(frozenset({"j1", "j2"}), 40.0)}, 100.0, True),  # still needed after cooldown
    ({("team-a", H100): SentReclaim(frozenset({"j1", "j2"}), 90.0)}, 100.0, True),  # another flavor
], ids=["first", "repeat", "subset", "new-job", "cooldown", "other-flavor"])
def test_a_reclaim_is_sent_once_per_blocked_jobs_and_again_after_the_cooldown(sent, now_s, expected):
    assert select_reclaims((REQUEST,), sent, now_s, cooldown_s=60.0) == ((REQUEST,) if expected else ())


def test_a_reclaim_event_names_the_borrowers_in_gpus_and_says_why():
    event = reclaim_event(REQUEST, tenancy(), "org", 2 * UNITS_PER_GPU, T0)
    assert (event.tenant, event.cohort, event.flavor, event.gpus, event.for_jobs) == (
        "team-a", "org", A100, 4.0, ["j1", "j2"])
    assert [(b.tenant, b.borrowed_gpus) for b in event.borrowers] == [("team-b", 6.0)]
    assert event.reason == ("tenant team-a holds 2 of its nominal 8 A100-80GB while team-b borrows 6: "
                            "reclaim 4 for 2 waiting jobs")


# --- operators' tenancy updates ----------------------------------------------------------------------

GOOD = "version: 1\nrevision: 3\ntenants: [{name: org, children: [{name: t, quota: {A100: {nominal: 1}}}]}]\n"
OPERATOR_OK = Verdict(OPERATOR, None)


def update(document: str = GOOD, revision: int = 3) -> ev.TenancyUpdated:
    return ev.TenancyUpdated(revision=revision, document=document, published_at=T0)


def test_an_operator_update_with_a_newer_revision_is_accepted():
    review = review_update(update(), OPERATOR_OK, in_force=2)
    assert isinstance(review, Accepted) and review.tenancy.revision == 3


@pytest.mark.parametrize("verdict, fragment", [
    (None, "has none to check with"),
    (Verdict(None, "credential 'k' does not verify"), "not authenticated: credential 'k' does not verify"),
    (Verdict("team-a", None), "a credential of tenant 'team-a' may not change the tenancy"),
], ids=["no-keys", "forged", "tenant-key"])
def test_only_an_operator_credential_may_change_the_tenancy(verdict, fragment):
    review = review_update(update(), verdict, in_force=2)
    assert isinstance(review, Rejected) and not review.stale
    assert fragment in review.problems[0]


def test_a_bad_file_is_rejected_with_every_problem():
    bad = "version: 1\nrevision: 3\npriority_classes: {a: 1}\ndefault_priority_class: b\ntenants: [{name: 'x y'}]\n"
    review = review_update(update(bad), OPERATOR_OK, in_force=2)
    assert isinstance(review, Rejected) and len(review.problems) == 2


@pytest.mark.parametrize("in_force, revision, stale", [(3, 3, True), (5, 3, True), (2, 4, False)])
def test_an_old_or_mismatched_revision_is_not_applied(in_force, revision, stale):
    review = review_update(update(revision=revision), OPERATOR_OK, in_force=in_force)
    assert isinstance(review, Rejected) and review.stale is stale


# --- the local stack's tenancy -----------------------------------------------------------------------


def test_the_local_stack_tenancy_covers_its_models_and_takes_any_other_tenant_as_a_guest():
    t = parse_tenancy(local_tenancy(node_specs(2, [H100, "A100-80GB+mig"], 8)))
    assert t.flavors == (H100, A100) and t.guest_tenant == "guests"
    assert set(t.leaves()) == {"research", "inference", "platform", "ml-eval", "guests"}
    assert t.nominal_units("research", A100) == 4 * UNITS_PER_GPU  # half of the 8 A100s
    assert charged(spec(tenant="kill-0", gpus=2), t)[0] == "guests"
    assert t.priority_classes == {"urgent": 100, "high": 50, "normal": 10, "batch": 0}


def test_limits_in_force_drain_what_a_tenant_holds_above_them_and_what_the_tenancy_no_longer_names():
    doc = {"version": 1, "revision": 2, "flavors": [A100], "priority_classes": {"batch": 0},
           "default_priority_class": "batch",
           "tenants": [{"name": "org", "children": [
               {"name": "team-a", "quota": {A100: {"nominal": 2, "borrowing_limit": 1}}},
               {"name": "team-b", "quota": {A100: {"nominal": 4}}}]}]}
    g = UNITS_PER_GPU
    held = {("team-a", A100): 5 * g, ("team-b", A100): g, ("team-c", A100): 2 * g, ("team-a", H100): g}
    assert limits_in_force(parse_tenancy(doc), held) == [
        UsageLimits("team-a", A100, 2 * g, 5 * g),  # 3 GPUs allowed, 5 held: nothing new fits until it drains
        UsageLimits("team-b", A100, 4 * g, None),  # no borrowing limit: only the cohort bounds it
        UsageLimits("team-a", H100, 0, g),  # a flavor no longer named: what runs drains
        UsageLimits("team-c", A100, 0, 2 * g),  # a tenant no longer named
    ]
    assert limits_in_force(parse_tenancy(doc), {})[0] == UsageLimits("team-a", A100, 2 * g, 3 * g)
