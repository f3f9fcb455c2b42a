"""What a request does and to what (pure): every action the gateway routes, and the resource it acts on.

Each action names its target, which fixes how a resource is judged (``authorize``):

- ``JOB``: one job, known by its tenant and the subject that submitted it (``Resource.job``), or a job id
  that names no job (``Resource.missing_job``: answered exactly like a job the principal may not see).
- ``TENANT``: something created in one tenant (a submission). ``Resource.in_tenant(None)``: the tenant was
  omitted, so it is the principal's own; a principal bound to none must name one.
- ``VIEW``: a read narrowable to one tenant (a job list, the queue, usage). Omitted: narrowed to the
  principal's own tenant where the role sees only that, else cluster-wide.
- ``CLUSTER``: what belongs to no tenant (nodes, the tenancy, tokens, producers): ``Resource.cluster()``.

Control actions (cancel, hold, release, logs; node cordon/uncordon/drain) are defined here before their
routes exist, so the route table can be designed against the full list.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Self


class Target(Enum):
    JOB = "job"
    TENANT = "tenant"
    VIEW = "view"
    CLUSTER = "cluster"


class Action(StrEnum):
    """``value``: the name routes and audit logs use; ``target``: what it acts on; ``phrase``: for reasons
    ("role user may not <phrase>"). A member cannot be declared without its target and phrase."""

    target: Target
    phrase: str

    def __new__(cls, value: str, target: Target, phrase: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.target = target
        member.phrase = phrase
        return member

    JOB_SUBMIT = "job.submit", Target.TENANT, "submit jobs"
    JOB_LIST = "job.list", Target.VIEW, "list jobs"
    JOB_READ = "job.read", Target.JOB, "read jobs"
    JOB_EVENTS = "job.events", Target.JOB, "read job events"
    JOB_LOGS = "job.logs", Target.JOB, "read job logs"
    JOB_CANCEL = "job.cancel", Target.JOB, "cancel jobs"
    JOB_HOLD = "job.hold", Target.JOB, "hold jobs"
    JOB_RELEASE = "job.release", Target.JOB, "release held jobs"
    QUEUE_READ = "queue.read", Target.VIEW, "read the queue"
    TENANTS_READ = "tenants.read", Target.VIEW, "read tenants' quota and usage"
    HISTORY_READ = "history.read", Target.VIEW, "read usage history"
    NODES_READ = "nodes.read", Target.CLUSTER, "read nodes"
    NODE_CORDON = "node.cordon", Target.CLUSTER, "cordon nodes"
    NODE_UNCORDON = "node.uncordon", Target.CLUSTER, "uncordon nodes"
    NODE_DRAIN = "node.drain", Target.CLUSTER, "drain nodes"
    TENANCY_WRITE = "tenancy.write", Target.CLUSTER, "change the tenancy"
    TOKENS_MANAGE = "tokens.manage", Target.CLUSTER, "manage tokens"
    PRODUCERS_MANAGE = "producers.manage", Target.CLUSTER, "manage producers"
    WHATIF_RUN = "whatif.run", Target.VIEW, "replay history (what-if)"


def all_actions() -> tuple[Action, ...]:
    """Every action, in declaration order: what the rule table and the route matrix test iterate."""
    return tuple(Action)


@dataclass(frozen=True)
class Resource:
    """What an action acts on. ``tenant``: the tenant it belongs to or is named for (None: cluster-wide, or
    omitted); ``subject``: for a job, the principal subject that submitted it; ``exists``: False only for a
    job id that names no job. Build with the constructors, which say which target each suits."""

    tenant: str | None = None
    subject: str | None = None
    exists: bool = True

    @classmethod
    def job(cls, tenant: str, subject: str) -> Resource:
        return cls(tenant=tenant, subject=subject)

    @classmethod
    def missing_job(cls) -> Resource:
        return cls(exists=False)

    @classmethod
    def in_tenant(cls, tenant: str | None) -> Resource:
        return cls(tenant=tenant)

    @classmethod
    def cluster(cls) -> Resource:
        return cls()
