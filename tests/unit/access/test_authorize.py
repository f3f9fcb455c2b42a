"""The gateway's one decision, as a table: every role x every action x own/other tenant x own/other subject,
with expectations written here, not derived from RULES; then the table's own invariants, then properties."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.access import (
    RULES, Action, Decision, Principal, Resource, Role, Scope, Target, all_actions, authorize,
)

A, R = Action, Role
PRINCIPALS = {R.USER: Principal("alice", R.USER, "t1"), R.TENANT_ADMIN: Principal("ann", R.TENANT_ADMIN, "t1"),
              R.VIEWER: Principal("vera", R.VIEWER), R.OPERATOR: Principal("olga", R.OPERATOR)}  # fmt: skip

# Jobs, per role: (its own job, a teammate's job in t1, a t2 job by a subject of the same name, no such job)
JOB_CASES = ("own job", "teammate's job", "other tenant's job", "missing job")
READ = {R.USER: (200, 200, 404, 404), R.TENANT_ADMIN: (200, 200, 404, 404), R.VIEWER: (403, 403, 403, 403),
        R.OPERATOR: (200, 200, 200, 404)}  # fmt: skip
CONTROL = {**READ, R.USER: (200, 403, 404, 404)}  # a user controls only what it submitted
JOB_EXPECTED = {A.JOB_READ: READ, A.JOB_EVENTS: READ, A.JOB_LOGS: CONTROL, A.JOB_CANCEL: CONTROL,
                A.JOB_HOLD: CONTROL, A.JOB_RELEASE: CONTROL}  # fmt: skip

# Tenants and views, per role: (tenant omitted, t1 named, t2 named) -> (status, the tenant acted for)
TENANT_CASES = {"tenant omitted": None, "own tenant": "t1", "other tenant": "t2"}
NO = ((403, None),) * 3
BOUND = {R.USER: ((200, "t1"), (200, "t1"), (403, None)), R.TENANT_ADMIN: ((200, "t1"), (200, "t1"), (403, None))}
ANYWHERE = ((200, None), (200, "t1"), (200, "t2"))
TENANT_EXPECTED = {
    A.JOB_SUBMIT: {**BOUND, R.VIEWER: NO, R.OPERATOR: ((403, None), (200, "t1"), (200, "t2"))},
    A.JOB_LIST: {**BOUND, R.VIEWER: NO, R.OPERATOR: ANYWHERE},
    A.QUEUE_READ: {**BOUND, R.VIEWER: ANYWHERE, R.OPERATOR: ANYWHERE},
    A.TENANTS_READ: {**BOUND, R.VIEWER: ANYWHERE, R.OPERATOR: ANYWHERE},
    A.HISTORY_READ: {**BOUND, R.VIEWER: ANYWHERE, R.OPERATOR: ANYWHERE},  # a user sees its tenant's history only
    # a replay of history: an operator's of any tenant or all, a tenant admin's of its tenant's jobs only
    A.WHATIF_RUN: {R.USER: NO, R.TENANT_ADMIN: BOUND[R.TENANT_ADMIN], R.VIEWER: NO, R.OPERATOR: ANYWHERE},
}

# The cluster's own things, per role: (user, tenant-admin, viewer, operator)
OPERATOR_ONLY = (403, 403, 403, 200)
CLUSTER_EXPECTED = {A.NODES_READ: (403, 403, 200, 200), A.NODE_CORDON: OPERATOR_ONLY, A.NODE_UNCORDON: OPERATOR_ONLY,
                    A.NODE_DRAIN: OPERATOR_ONLY, A.TENANCY_WRITE: OPERATOR_ONLY, A.TOKENS_MANAGE: OPERATOR_ONLY,
                    A.PRODUCERS_MANAGE: OPERATOR_ONLY}  # fmt: skip


def job_resource(case: str, principal: Principal) -> Resource:
    return {"own job": Resource.job("t1", principal.subject), "teammate's job": Resource.job("t1", "bob"),
            "other tenant's job": Resource.job("t2", principal.subject),
            "missing job": Resource.missing_job()}[case]  # fmt: skip


def scenarios():
    for action, by_role in JOB_EXPECTED.items():
        for role, statuses in by_role.items():
            for case, status in zip(JOB_CASES, statuses, strict=True):
                resource = job_resource(case, PRINCIPALS[role])
                tenant = resource.tenant if status == 200 else None
                yield pytest.param(PRINCIPALS[role], action, resource, status, tenant, id=f"{role}-{action}-{case}")
    for action, by_role in TENANT_EXPECTED.items():
        for role, outcomes in by_role.items():
            for (case, named), (status, tenant) in zip(TENANT_CASES.items(), outcomes, strict=True):
                yield pytest.param(PRINCIPALS[role], action, Resource.in_tenant(named), status, tenant,
                                   id=f"{role}-{action}-{case}")
    for action, statuses in CLUSTER_EXPECTED.items():
        for role, status in zip(PRINCIPALS, statuses, strict=True):
            yield pytest.param(PRINCIPALS[role], action, Resource.cluster(), status, None, id=f"{role}-{action}")


@pytest.mark.parametrize(("principal", "action", "resource", "status", "tenant"), list(scenarios()))
def test_a_request_gets_the_status_its_role_and_resource_call_for(principal, action, resource, status, tenant):
    decision = authorize(principal, action, resource)
    assert (decision.status, decision.allowed, decision.tenant) == (status, status == 200, tenant)
    assert f"role {principal.role}" in decision.reason and f"({action})" in decision.reason


def test_the_scenario_table_has_a_row_for_every_action():
    assert {*JOB_EXPECTED, *TENANT_EXPECTED, *CLUSTER_EXPECTED} == set(all_actions())
    assert all(set(by_role) == set(Role) for by_role in [*JOB_EXPECTED.values(), *TENANT_EXPECTED.values()])


def test_a_denial_reads_as_a_sentence():
    decision = authorize(PRINCIPALS[R.USER], A.TOKENS_MANAGE, Resource.cluster())
    assert decision == Decision(False, 403, "role user may not manage tokens (tokens.manage)")


@pytest.mark.parametrize("role", [R.USER, R.TENANT_ADMIN])
def test_a_tenant_bound_role_bound_to_no_tenant_is_denied_everything_and_told_why(role):
    principal = Principal("nobody", role)
    for action in all_actions():
        resource = Resource.job("t1", "nobody") if action.target is Target.JOB else Resource.in_tenant("t1")
        decision = authorize(principal, action, resource)
        assert decision.status == 403
        assert "bound to no tenant" in decision.reason or RULES[role, action] is Scope.NONE


def test_an_operator_bound_to_no_tenant_must_name_the_tenant_it_submits_for():
    decision = authorize(PRINCIPALS[R.OPERATOR], A.JOB_SUBMIT, Resource.in_tenant(None))
    assert (decision.status, "name the tenant" in decision.reason) == (403, True)


def test_a_viewer_bound_to_a_tenant_still_reads_no_job():
    assert authorize(Principal("vera", R.VIEWER, "t1"), A.JOB_READ, Resource.job("t1", "vera")).status == 403


# The table's own invariants: total, each scope where it means something, no acting on what one cannot read.
def test_the_rules_give_every_role_a_scope_for_every_action():
    assert set(RULES) == {(role, action) for role in Role for action in all_actions()}


def test_all_actions_lists_every_action_once_with_a_phrase():
    assert len(all_actions()) == len(Action.__members__)  # a duplicated value would make a silent alias
    assert all(action.phrase and "." in action for action in all_actions())


def test_own_subject_scopes_only_job_actions_and_cluster_actions_are_none_or_any():
    for (role, action), scope in RULES.items():
        assert scope is not Scope.OWN_SUBJECT or action.target is Target.JOB, (role, action)
        assert action.target is not Target.CLUSTER or scope in (Scope.NONE, Scope.ANY), (role, action)


def test_no_role_may_act_on_a_job_it_may_not_read():
    width = list(Scope)  # none < own-subject < own-tenant < any
    for (role, action), scope in RULES.items():
        if action.target is Target.JOB:
            assert width.index(scope) <= width.index(RULES[role, A.JOB_READ]), (role, action)


def test_the_rules_are_read_only_and_a_missing_rule_denies(monkeypatch):
    with pytest.raises(TypeError):
        RULES[R.USER, A.TOKENS_MANAGE] = Scope.ANY  # type: ignore[index]
    module = importlib.import_module("gpusched_core.access.authorize")
    monkeypatch.setattr(module, "RULES", {k: v for k, v in RULES.items() if k != (R.OPERATOR, A.NODE_DRAIN)})
    assert authorize(PRINCIPALS[R.OPERATOR], A.NODE_DRAIN, Resource.cluster()).status == 403


# Properties over any principal, action and resource.
NAMES = st.sampled_from([None, "t1", "t2"])
PRINCIPAL = st.builds(Principal, st.sampled_from(["alice", "bob"]), st.sampled_from(list(Role)), NAMES)
RESOURCE = st.builds(Resource, NAMES, st.sampled_from([None, "alice", "bob"]), st.booleans())
ACTION = st.sampled_from(all_actions())
JOB_ACTION = st.sampled_from([a for a in all_actions() if a.target is Target.JOB])
PROPERTIES = settings(max_examples=300, deadline=None)


@PROPERTIES
@given(PRINCIPAL, ACTION, RESOURCE)
def test_every_decision_is_200_403_or_404_and_says_why_naming_the_role_and_the_action(principal, action, resource):
    decision = authorize(principal, action, resource)
    assert decision.status in (200, 403, 404) and decision.allowed == (decision.status == 200)
    assert decision.reason and f"role {principal.role}" in decision.reason and f"({action})" in decision.reason


@PROPERTIES
@given(st.sampled_from(["olga"]), NAMES, ACTION, RESOURCE.filter(lambda r: r.exists))
def test_an_operator_may_do_anything_to_anything_that_exists(subject, tenant, action, resource):
    operator = Principal(subject, R.OPERATOR, tenant)
    names_a_tenant = action is not A.JOB_SUBMIT or bool(resource.tenant or tenant)
    assert authorize(operator, action, resource).allowed == names_a_tenant


@PROPERTIES
@given(PRINCIPAL.filter(lambda p: p.tenant is not None), JOB_ACTION, st.sampled_from(["alice", "bob"]))
def test_another_tenant_s_job_is_hidden_never_forbidden_when_the_role_has_the_action(principal, action, subject):
    other = Resource.job("t2" if principal.tenant == "t1" else "t1", subject)
    assert RULES[principal.role, action] is Scope.NONE or authorize(principal, action, other).status in (200, 404)


@PROPERTIES
@given(PRINCIPAL, JOB_ACTION, RESOURCE.filter(lambda r: r.exists))
def test_a_missing_job_is_answered_exactly_like_one_the_principal_may_not_read(principal, action, resource):
    missing = authorize(principal, action, Resource.missing_job())
    assert not missing.allowed
    if authorize(principal, action, resource).status == 404:
        assert authorize(principal, action, resource) == missing  # same status, same words


WIDER = {R.USER: R.TENANT_ADMIN, R.TENANT_ADMIN: R.OPERATOR, R.VIEWER: R.OPERATOR}


@PROPERTIES
@given(PRINCIPAL.filter(lambda p: p.role in WIDER), ACTION, RESOURCE)
def test_a_wider_role_never_loses_a_permission(principal, action, resource):
    wider = Principal(principal.subject, WIDER[principal.role], principal.tenant)
    assert not authorize(principal, action, resource).allowed or authorize(wider, action, resource).allowed
