"""Who may do what through the gateway (pure): principals, actions, resources, and ONE decision.

The gateway authenticates a request into a ``Principal`` (a token, an OIDC JWT, a producer's key; never a
payload's claims), names the route's ``Action``, builds the ``Resource`` it acts on, and answers with the
``Decision``: 200 goes on, 403 or 404 is returned as is, with ``reason`` as the detail.

Typical use, in a route (the shell loads the job; the core decides)::

    from gpusched_core import access

    job = await load_job_owner(conn, job_id)  # (tenant, subject) or None
    resource = access.Resource.job(*job) if job else access.Resource.missing_job()
    decision = access.authorize(principal, access.Action.JOB_CANCEL, resource)
    if not decision.allowed:
        raise HTTPException(decision.status, decision.reason)

    # a submission or a list: act for decision.tenant (the omitted tenant resolved), never the raw field
    decision = access.authorize(principal, access.Action.JOB_SUBMIT, access.Resource.in_tenant(body.tenant))

- `principal`: `Role` (user, tenant-admin, viewer, operator) and `Principal` (subject, role, tenant).
- `actions`: `Action` (each with its `Target`: job, tenant, view, cluster), `all_actions()`, `Resource`.
- `authorize`: `Scope`, `RULES` (role x action -> scope, total), `Decision`, `authorize`; the module
  docstring gives the order of the rules and why another tenant's job is 404, not 403.
"""

from .actions import Action, Resource, Target, all_actions
from .authorize import RULES, Decision, Scope, authorize, never
from .principal import Principal, Role

__all__ = ["RULES", "Action", "Decision", "Principal", "Resource", "Role", "Scope", "Target", "all_actions",
           "authorize", "never"]
