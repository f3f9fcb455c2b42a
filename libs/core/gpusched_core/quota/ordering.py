"""The order of pending work: a documented total order, one sort key per job.

``FairShareOrder`` (the default) sorts by, in turn:

1. guaranteed first: 0 when the job fits within what its tenant's nominal quota of the job's first
   flavor leaves free at the start of the cycle, else 1 (the job needs to borrow). Work a tenant is
   guaranteed is never queued behind borrowing (and, when borrowers hold the tenant's share, the
   cycle asks for it back with a reclaim request);
2. priority class, higher value first;
3. ``level``, lower first (0 for live jobs; a simulator's least-attained-service queue);
4. the tenant's fair share, lower first: the larger of its reserved and decayed average usage over its
   fair entitlement (its weighted max-min share of the cohort given everyone's demand; see ``fairness``);
5. submission time, earlier first;
6. job id: the tie-break that makes the order total (ids are unique).

``FifoOrder`` is the same without the share. Orders are ``JobOrder`` values chosen by name;
an order's ``merged_key`` must start with ``-priority`` and keep a tenant's own jobs in ``tenant_key``
order whatever its share, which is what lets a cycle merge per-tenant queues instead of sorting
everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .units import QuotaAsk

SortKey = tuple


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting for quota. ``level`` is 0 unless a policy (e.g. LAS) demotes the job."""

    job_id: str
    tenant: str
    ask: QuotaAsk
    priority_class: str
    submitted_at_s: float
    level: int = 0


class JobOrder(Protocol):
    """How pending jobs are ranked. ``tenant_key`` orders one tenant's jobs; ``merged_key`` (built from
    it and the tenant's fair share) orders everybody's. Both must end in the job id."""

    name: str

    def tenant_key(self, job: PendingJob, priority: int) -> SortKey: ...

    def merged_key(self, tenant_key: SortKey, share: float) -> SortKey: ...


@dataclass(frozen=True)
class FairShareOrder:
    name: str = "fairshare"

    def tenant_key(self, job: PendingJob, priority: int) -> SortKey:
        return (-priority, job.level, job.submitted_at_s, job.job_id)

    def merged_key(self, tenant_key: SortKey, share: float) -> SortKey:
        return (tenant_key[0], tenant_key[1], share, tenant_key[2], tenant_key[3])


@dataclass(frozen=True)
class FifoOrder:
    name: str = "fifo"

    def tenant_key(self, job: PendingJob, priority: int) -> SortKey:
        return (-priority, job.level, job.submitted_at_s, job.job_id)

    def merged_key(self, tenant_key: SortKey, share: float) -> SortKey:
        return tenant_key


ORDERS: dict[str, JobOrder] = {"fairshare": FairShareOrder(), "fifo": FifoOrder()}


def order_by_name(name: str) -> JobOrder:
    try:
        return ORDERS[name]
    except KeyError:
        raise ValueError(f"unknown job order {name!r}; known: {', '.join(sorted(ORDERS))}") from None
