"""May this principal do this action to this resource (pure): ONE rule table and the function that reads it.

``RULES`` maps every (role, action) pair to a scope; ``authorize`` applies it in this order, first answer
wins (every answer is 200, 403 or 404; a denial always says why, naming the role and the action):

1. scope ``none``: 403. The role never has the action, whatever the resource, so the answer leaks
   nothing and the gateway may give it before loading anything.
2. scope ``own-tenant`` / ``own-subject`` and the principal is bound to no tenant: 403.
3. by the action's target (``actions.Target``):
   - JOB: a job the role may not *read* (another tenant's, or one that does not exist) is 404, with one
     reason for both, so neither status nor text tells them apart. A visible job outside the action's
     scope (a teammate's job, for a ``user`` cancelling) is 403: its existence is no secret.
   - TENANT / VIEW: an omitted tenant is the principal's own (a VIEW with scope ``any`` stays
     cluster-wide); naming another tenant under ``own-tenant`` is 403; a submission for no tenant is 403.
   - CLUSTER: only ``any`` allows.
   ``Decision.tenant`` says which tenant an allowed request acts for or is narrowed to (None:
   cluster-wide): the gateway submits for, and filters by, that tenant, never the raw request's.

Choices (Slurm's and Kueue's users expect them): ``user`` reads every job of its tenant (the issue's
"submit, read"), but cancels, holds, releases and reads the logs of only the jobs it submitted (Slurm:
``scancel``/``scontrol hold`` on one's own jobs; logs may hold data a teammate should not see);
``tenant-admin`` does all of it for every job of its tenant (Slurm's account coordinator); ``viewer`` reads
the queue, tenants' usage, usage history and nodes cluster-wide but no job (its tenant, if any, is ignored); ``operator``
does everything. A rule missing from the table denies (403); ``tests/unit/access`` requires it total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from .actions import Action, Resource, Target
from .principal import Principal, Role


class Scope(StrEnum):
    NONE = "none"  # never
    OWN_SUBJECT = "own-subject"  # jobs of its bound tenant that it submitted (JOB actions only)
    OWN_TENANT = "own-tenant"  # what belongs to its bound tenant
    ANY = "any"  # any tenant's, and the cluster's


_NO, _MINE, _TENANT, _ANY = Scope.NONE, Scope.OWN_SUBJECT, Scope.OWN_TENANT, Scope.ANY
_ROLES = (Role.USER, Role.TENANT_ADMIN, Role.VIEWER, Role.OPERATOR)
_TABLE: dict[Action, tuple[Scope, ...]] = {
    #                        user     tenant-admin viewer operator
    Action.JOB_SUBMIT:       (_TENANT, _TENANT, _NO, _ANY),
    Action.JOB_LIST:         (_TENANT, _TENANT, _NO, _ANY),
    Action.JOB_READ:         (_TENANT, _TENANT, _NO, _ANY),
    Action.JOB_EVENTS:       (_TENANT, _TENANT, _NO, _ANY),
    Action.JOB_LOGS:         (_MINE, _TENANT, _NO, _ANY),
    Action.JOB_CANCEL:       (_MINE, _TENANT, _NO, _ANY),
    Action.JOB_HOLD:         (_MINE, _TENANT, _NO, _ANY),
    Action.JOB_RELEASE:      (_MINE, _TENANT, _NO, _ANY),
    Action.QUEUE_READ:       (_TENANT, _TENANT, _ANY, _ANY),
    Action.TENANTS_READ:     (_TENANT, _TENANT, _ANY, _ANY),
    Action.HISTORY_READ:     (_TENANT, _TENANT, _ANY, _ANY),
    Action.NODES_READ:       (_NO, _NO, _ANY, _ANY),
    Action.NODE_CORDON:      (_NO, _NO, _NO, _ANY),
    Action.NODE_UNCORDON:    (_NO, _NO, _NO, _ANY),
    Action.NODE_DRAIN:       (_NO, _NO, _NO, _ANY),
    Action.TENANCY_WRITE:    (_NO, _NO, _NO, _ANY),
    Action.TOKENS_MANAGE:    (_NO, _NO, _NO, _ANY),
    Action.PRODUCERS_MANAGE: (_NO, _NO, _NO, _ANY),
    Action.WHATIF_RUN:       (_NO, _TENANT, _NO, _ANY),
}  # fmt: skip
RULES: Mapping[tuple[Role, Action], Scope] = MappingProxyType(
    {(role, action): scope for action, row in _TABLE.items() for role, scope in zip(_ROLES, row, strict=True)}
)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    status: int  # 200 allowed; 403 not this role, or not here; 404 no such job, as far as the principal knows
    reason: str  # human readable; names the role and the action
    tenant: str | None = None  # when allowed: the tenant acted for or narrowed to; None: cluster-wide


def authorize(principal: Principal, action: Action, resource: Resource) -> Decision:
    """The one decision of every gateway request (see the module docstring for the order of the rules)."""
    scope = RULES.get((principal.role, action), Scope.NONE)
    who = f"role {principal.role}"
    if scope is Scope.NONE:
        return _deny(403, f"{who} may not {action.phrase} ({action})")
    if scope is not Scope.ANY and not principal.tenant:
        return _deny(403, f"{who} may {action.phrase} only within its tenant, and principal "
                          f"{principal.subject!r} is bound to no tenant ({action})")  # fmt: skip
    if action.target is Target.JOB:
        return _job(principal, action, scope, resource)
    if action.target is Target.CLUSTER:
        if scope is Scope.ANY:
            return _allow(f"{who} may {action.phrase} ({action})", None)
        return _deny(403, f"{who} may {action.phrase} only within a tenant, and this belongs to none ({action})")
    return _tenant(principal, action, scope, resource)


def never(principal: Principal, action: Action) -> Decision | None:
    """The 403 of a role that never has ``action`` (scope ``none``), before anything is loaded; None when
    it may, for some resource (a batch is refused whole by this, then judged job by job)."""
    if RULES.get((principal.role, action), Scope.NONE) is Scope.NONE:
        return _deny(403, f"role {principal.role} may not {action.phrase} ({action})")
    return None


def _covers(scope: Scope, principal: Principal, resource: Resource) -> bool:
    if scope is Scope.ANY:
        return True
    same_tenant = bool(principal.tenant) and resource.tenant == principal.tenant
    if scope is Scope.OWN_TENANT:
        return same_tenant
    return scope is Scope.OWN_SUBJECT and same_tenant and bool(principal.subject) and (
        resource.subject == principal.subject)


def _job(principal: Principal, action: Action, scope: Scope, resource: Resource) -> Decision:
    who = f"role {principal.role}"
    visible = resource.exists and _covers(RULES.get((principal.role, Action.JOB_READ), Scope.NONE), principal,
                                          resource)  # fmt: skip
    if not visible:  # one answer for "another tenant's" and "none such": nothing leaks
        return _deny(404, f"{who} sees no such job ({action})")
    when = {Scope.OWN_SUBJECT: "it submitted them", Scope.OWN_TENANT: f"they are its tenant {principal.tenant}'s",
            Scope.ANY: "they are any tenant's"}[scope]  # fmt: skip
    if not _covers(scope, principal, resource):  # it may see the job, so saying so leaks nothing
        return _deny(403, f"{who} may {action.phrase} only when {when} ({action})")
    return _allow(f"{who} may {action.phrase} when {when} ({action})", resource.tenant)


def _tenant(principal: Principal, action: Action, scope: Scope, resource: Resource) -> Decision:
    """TENANT and VIEW targets: resolve the omitted tenant, then judge the one named."""
    who = f"role {principal.role}"
    named = resource.tenant or None
    if named is None and (action.target is Target.TENANT or scope is not Scope.ANY):
        named = principal.tenant or None
    if named is None and action.target is Target.TENANT:
        return _deny(403, f"{who} is bound to no tenant: name the tenant to {action.phrase} for ({action})")
    if scope is Scope.ANY:
        return _allow(f"{who} may {action.phrase} for {named or 'the whole cluster'} ({action})", named)
    if scope is Scope.OWN_TENANT and named == principal.tenant:
        return _allow(f"{who} may {action.phrase} for its tenant {named} ({action})", named)
    if scope is Scope.OWN_TENANT:
        return _deny(403, f"{who} may {action.phrase} only for its tenant {principal.tenant}, not {named} "
                          f"({action})")  # fmt: skip
    return _deny(403, f"{who} has no rule for {action.phrase} narrowed by subject ({action})")  # fails closed


def _allow(reason: str, tenant: str | None) -> Decision:
    return Decision(allowed=True, status=200, reason=reason, tenant=tenant)


def _deny(status: int, reason: str) -> Decision:
    return Decision(allowed=False, status=status, reason=reason)
