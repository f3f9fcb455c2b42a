"""Pending work grouped into per-tenant queues, each sorted by its order's ``tenant_key``.

A queue holds one tenant's jobs whose first flavor option is the same; a cycle merges the queues by
the full key (``ordering``), which equals sorting everything because a tenant's share and tier are the
same for all of its queue. A simulator may keep queues sorted incrementally and pass them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from .ledger import QuotaBook
from .model import Tenancy
from .ordering import JobOrder, PendingJob, SortKey

UNKNOWN_PRIORITY = -(10**9)


@dataclass(frozen=True, slots=True)
class PendingQueue:
    """``entries`` sorted by tenant key; ``min_units`` / ``max_units`` the smallest / largest
    first-option units among them; ``single_option``: no job has a second flavor option (lets a cycle
    drop the queue early)."""

    tenant: str
    flavor: str
    entries: Sequence[tuple[SortKey, PendingJob]]
    min_units: int
    max_units: int
    single_option: bool


def priority_value(tenancy: Tenancy, job: PendingJob) -> int:
    return tenancy.priority_classes.get(job.priority_class, UNKNOWN_PRIORITY)


def build_queues(tenancy: Tenancy, pending: Iterable[PendingJob], order: JobOrder) -> list[PendingQueue]:
    groups: dict[tuple[str, str], list[tuple[SortKey, PendingJob]]] = {}
    priorities, tenant_key = tenancy.priority_classes, order.tenant_key
    values: dict[str, int] = {}
    for job in pending:
        klass = job.priority_class
        value = values.get(klass)
        if value is None:
            value = values[klass] = priorities.get(klass, UNKNOWN_PRIORITY)
        group = (job.tenant, job.ask.options[0][0])
        entries = groups.get(group)
        if entries is None:
            groups[group] = [(tenant_key(job, value), job)]
        else:
            entries.append((tenant_key(job, value), job))
    queues = []
    for (tenant, flavor), entries in sorted(groups.items()):
        entries.sort(key=itemgetter(0))  # keys are unique: they end in the job id
        options = [job.ask.options for _, job in entries]
        sizes = [option[0][1] for option in options]
        queues.append(PendingQueue(tenant, flavor, entries, min(sizes), max(sizes), max(map(len, options)) == 1))
    return queues


def split_by_tier(book: QuotaBook, queues: Sequence[PendingQueue]) -> tuple[list[PendingQueue], list[int]]:
    """Queues and their tiers: 0 for jobs that fit within what their tenant's nominal quota leaves
    free at the start of the cycle (guaranteed work), 1 for jobs that need to borrow. A queue with
    both is split in two (each part keeps its order)."""
    out: list[PendingQueue] = []
    tiers: list[int] = []
    for queue in queues:
        known = queue.tenant in book.tree.index
        headroom = book.nominal(queue.tenant, queue.flavor) - book.used(queue.tenant, queue.flavor) if known else -1
        if queue.max_units <= headroom or queue.min_units > headroom:
            out.append(queue)
            tiers.append(0 if queue.max_units <= headroom else 1)
            continue
        for tier, part in enumerate(_partition(queue.entries, headroom)):
            sizes = [job.ask.options[0][1] for _, job in part]
            out.append(PendingQueue(queue.tenant, queue.flavor, part, min(sizes), max(sizes), queue.single_option))
            tiers.append(tier)
    return out, tiers


def _partition(entries: Sequence[tuple[SortKey, PendingJob]], headroom: int) -> tuple[list, list]:
    inside: list = []
    outside: list = []
    for entry in entries:
        (inside if entry[1].ask.options[0][1] <= headroom else outside).append(entry)
    return inside, outside
