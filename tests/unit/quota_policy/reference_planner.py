"""The quota planner as it was before its performance work (commit 6554a58): ``QuotaCycle``,
``plan_cycle``, ``order_pending``, ``build_queues``, ``split_by_tier`` and ``waiting_list``, unchanged
but for imports and the tenants' shares (now the fair-share deficit, ``planner.tenant_shares``).
``test_optimised_planner`` checks that the live planner decides exactly as this one on random inputs. Change both together when the planner's decisions are meant to change. Its plan is the
plan of that time (``waiting`` a field, ranked at once), compared with the live plan's ``waiting``."""

# ruff: noqa

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusched_core.quota.ledger import QuotaBook
from gpusched_core.quota.model import Tenancy
from gpusched_core.quota.ordering import FairShareOrder, JobOrder, PendingJob, SortKey
from gpusched_core.quota.planner import Candidate, ReclaimRequest, Reservation, tenant_shares
from gpusched_core.quota.queues import UNKNOWN_PRIORITY, PendingQueue
from gpusched_core.quota.reasons import (
    WAITING_FOR_CAPACITY,
    WaitCategory,
    WaitingJob,
    not_allowed,
    quota_block,
    unknown_tenant,
)
from gpusched_core.quota.snapshot import QuotaSnapshot
from gpusched_core.quota.units import format_gpus, gpu_equivalents



@dataclass(frozen=True)
class QuotaPlan:
    order: str
    reservations: tuple[Reservation, ...]
    waiting: tuple[WaitingJob, ...]
    reclaims: tuple[ReclaimRequest, ...]
    usage: Mapping[str, Mapping[str, int]]


class QuotaCycle:
    """One planning cycle over per-tenant queues (see ``queues.build_queues``).

    A queue leaves the walk as soon as its smallest job can no longer fit (availability only shrinks
    during a cycle); its remaining jobs are settled at ``finish`` (reclaim claims, and with
    ``explain`` their reasons), so the walk costs about what it reserves, not what is pending. With
    ``explain=False`` (simulation) waiting jobs are not listed."""

    def __init__(self, snapshot: QuotaSnapshot, queues: Sequence[PendingQueue], order: JobOrder,
                 *, explain: bool = True, shares: Mapping[str, float] | None = None) -> None:
        self.snapshot, self.order, self.explain = snapshot, order, explain
        self.book = QuotaBook.from_usage(snapshot.tenancy, snapshot.usage)
        self._shares = shares if shares is not None else tenant_shares(snapshot, queues)
        self._queues, self._tiers = split_by_tier(self.book, queues)
        self._heap: list[tuple[SortKey, int, int]] = []
        for qi, queue in enumerate(self._queues):
            if queue.entries:
                self._push(qi, 0)
        self._reserved: list[Reservation] = []
        self._records: list[tuple[SortKey, PendingJob, WaitCategory, str]] = []
        self._stash: list[tuple[int, int]] = []  # (queue, first position) left out of the walk
        self._blocked: dict[tuple[str, str], int] = {}  # smallest units that did not fit, per tenant/flavor
        self._claims: dict[tuple[str, str], list] = {}  # (tenant, flavor) -> [units, job ids]
        self._refusals: dict[tuple[str, str], tuple[WaitCategory, str] | None] = {}
        self._reasons: dict[tuple, tuple[WaitCategory, str]] = {}
        self._open: Candidate | None = None

    def _key(self, qi: int, tenant_key: SortKey) -> SortKey:
        queue = self._queues[qi]
        return (self._tiers[qi], *self.order.merged_key(tenant_key, self._shares.get(queue.tenant, 0.0)))

    def _push(self, qi: int, pos: int) -> None:
        heapq.heappush(self._heap, (self._key(qi, self._queues[qi].entries[pos][0]), qi, pos))

    def _advance(self, qi: int, pos: int, exhausted: bool) -> None:
        """After visiting entry ``pos`` of queue ``qi``: walk on, or set the rest aside."""
        if pos + 1 < len(self._queues[qi].entries):
            if exhausted:
                self._stash.append((qi, pos + 1))
            else:
                self._push(qi, pos + 1)

    def next_candidate(self) -> Candidate | None:
        """The next job in order that fits quota now; jobs passed over are recorded as waiting."""
        if self._open is not None:
            self.defer(self._open)
        while self._heap:
            key, qi, pos = heapq.heappop(self._heap)
            queue = self._queues[qi]
            found = self._check(queue.entries[pos][1], key)
            self._advance(qi, pos, found is None and self._queue_exhausted(queue))
            if found is not None:
                self._open = found
                return found
        return None

    def reserve(self, candidate: Candidate) -> Reservation:
        job, flavor, units = candidate.job, candidate.flavor, candidate.units
        nominal = self.book.nominal(job.tenant, flavor)
        before = self.book.used(job.tenant, flavor)
        self.book.charge(job.tenant, flavor, units)
        borrowed = max(0, before + units - nominal) - max(0, before - nominal)
        geq = gpu_equivalents(units, flavor, self.snapshot.tenancy.gpu_equivalents)
        reservation = Reservation(job.job_id, job.tenant, flavor, units, borrowed, geq)
        self._reserved.append(reservation)
        self._open = None
        return reservation

    def defer(self, candidate: Candidate, reason: str = WAITING_FOR_CAPACITY) -> None:
        """The caller could not use a candidate that fits quota (e.g. no node has room)."""
        if self.explain:
            self._records.append((candidate.key, candidate.job, WaitCategory.CAPACITY, reason))
        self._open = None

    def finish(self) -> QuotaPlan:
        """The plan. With ``explain``, every job not reserved is listed as waiting, in queue order."""
        if self._open is not None:
            self.defer(self._open)
        while self.explain and self._heap:
            key, qi, pos = heapq.heappop(self._heap)
            queue = self._queues[qi]
            found = self._check(queue.entries[pos][1], key)
            if found is not None:
                self._records.append((key, found.job, WaitCategory.CAPACITY, WAITING_FOR_CAPACITY))
            self._advance(qi, pos, found is None and self._queue_exhausted(queue))
        if not self.explain:  # the caller stopped early: what is left may still be owed a reclaim
            self._stash.extend((qi, pos) for _, qi, pos in self._heap)
            self._heap = []
        for qi, pos in self._stash:
            self._settle(qi, pos)
        waiting = waiting_list(self._records, self.snapshot.tenancy.priority_classes) if self.explain else ()
        return QuotaPlan(self.order.name, tuple(self._reserved), waiting, self._reclaims(), self.book.snapshot())

    # --- internals ------------------------------------------------------------------------------

    def _check(self, job: PendingJob, key: SortKey) -> Candidate | None:
        refusal = self._refusal_of(job)
        if refusal is not None:
            if self.explain:
                self._records.append((key, job, *refusal))
            return None
        tenant, blocked = job.tenant, self._blocked
        owed_to: str | None = None
        for flavor, units in job.ask.options:
            smallest = blocked.get((tenant, flavor))
            if smallest is not None and smallest <= units:
                continue
            if units <= self.book.available(tenant, flavor):
                owed = self._owed(tenant, flavor, units)
                if owed is None:
                    return Candidate(job, flavor, units, key)
                owed_to = owed_to or owed
            blocked[(tenant, flavor)] = units
        claimed = self._claim(job)
        if self.explain:
            reason = (WaitCategory.RECLAIMING, owed_to) if owed_to else self._reason(job, claimed)
            self._records.append((key, job, *reason))
        return None

    def _owed(self, tenant: str, flavor: str, units: int) -> str | None:
        """A borrower may not take cohort capacity that tenants under their nominal quota have claimed
        this cycle toward a reclaim (else capacity freed by a reclaim would go straight back to the
        borrowers it was taken from). The reason it waits, or None when it may borrow."""
        if not self._claims:
            return None
        headroom = max(0, self.book.nominal(tenant, flavor) - self.book.used(tenant, flavor))
        if units <= headroom:
            return None  # within its own nominal quota: nothing borrowed
        tenancy = self.snapshot.tenancy
        root = tenancy.root_of(tenant)
        owed = {t: claim[0] for (t, f), claim in self._claims.items()
                if f == flavor and t != tenant and claim[0] and tenancy.root_of(t) == root}
        if not owed or units <= self.book.available(tenant, flavor) - sum(owed.values()):
            return None
        whom = ", ".join(f"{t} ({format_gpus(u)})" for t, u in sorted(owed.items()))
        return (f"cohort capacity of {flavor} is owed to tenants under their nominal quota: {whom}; "
                f"borrowing waits")

    def _claim(self, job: PendingJob) -> int:
        """Count a job that fits its tenant's nominal quota but not what is free toward a reclaim;
        returns the units claimed before it."""
        flavor, units = job.ask.options[0]
        claim = self._claims.get((job.tenant, flavor))
        claimed = claim[0] if claim is not None else 0
        if self.book.used(job.tenant, flavor) + claimed + units <= self.book.nominal(job.tenant, flavor):
            if claim is None:
                claim = self._claims[(job.tenant, flavor)] = [0, []]
            claim[0] += units
            claim[1].append(job.job_id)
        return claimed

    def _reason(self, job: PendingJob, claimed: int) -> tuple[WaitCategory, str]:
        flavor, units = job.ask.options[0]
        memo = (job.tenant, flavor, units, claimed, len(self._reserved))
        if memo not in self._reasons:
            self._reasons[memo] = quota_block(self.book, job.tenant, flavor, units, claimed)
        return self._reasons[memo]

    def _settle(self, qi: int, pos: int) -> None:
        """Jobs of a queue that left the walk: none fits; claim toward reclaims while the tenant has
        nominal headroom, and with ``explain`` record each with its reason."""
        queue = self._queues[qi]
        tenant, flavor = queue.tenant, queue.flavor
        claim = self._claims.setdefault((tenant, flavor), [0, []])
        headroom = self.book.nominal(tenant, flavor) - self.book.used(tenant, flavor) - claim[0]
        records, explain = self._records, self.explain
        for tenant_key, job in queue.entries[pos:]:
            if not explain and headroom < queue.min_units:
                break
            refusal = self._refusal_of(job)
            if refusal is None:
                units, claimed = job.ask.options[0][1], claim[0]
                if units <= headroom:
                    claim[0] += units
                    claim[1].append(job.job_id)
                    headroom -= units
                if explain:
                    records.append((self._key(qi, tenant_key), job, *self._reason(job, claimed)))
            elif explain:
                records.append((self._key(qi, tenant_key), job, *refusal))
        if not claim[0]:
            del self._claims[(tenant, flavor)]

    def _refusal_of(self, job: PendingJob) -> tuple[WaitCategory, str] | None:
        memo = (job.tenant, job.priority_class)
        if memo not in self._refusals:
            self._refusals[memo] = self._refusal(job)
        return self._refusals[memo]

    def _refusal(self, job: PendingJob) -> tuple[WaitCategory, str] | None:
        """Why a job can never be considered (unknown tenant, priority class not allowed), or None."""
        tenant = self.snapshot.tenancy.tenants.get(job.tenant)
        if tenant is None or not tenant.is_leaf:
            return WaitCategory.UNKNOWN_TENANT, unknown_tenant(job.tenant)
        if job.priority_class not in tenant.priority_classes:
            return WaitCategory.PRIORITY_CLASS, not_allowed(job.tenant, job.priority_class, tenant.priority_classes)
        return None

    def _queue_exhausted(self, queue: PendingQueue) -> bool:
        blocked = self._blocked.get((queue.tenant, queue.flavor))
        return queue.single_option and blocked is not None and queue.min_units >= blocked

    def _reclaims(self) -> tuple[ReclaimRequest, ...]:
        out = []
        borrowing: dict[tuple[str, str], list[tuple[str, int]]] = {}  # (root, flavor) -> borrowers
        for (tenant, flavor), (claimed, jobs) in sorted(self._claims.items()):
            short = claimed - self.book.available(tenant, flavor)
            if short <= 0:
                continue
            root = self.snapshot.tenancy.root_of(tenant)
            if (root, flavor) not in borrowing:
                borrowing[(root, flavor)] = sorted(
                    ((b, self.book.borrowed(b, flavor)) for b in self.book.cohort_members(tenant)
                     if self.book.borrowed(b, flavor) > 0), key=lambda x: (-x[1], x[0]))
            borrowers = tuple(b for b in borrowing[(root, flavor)] if b[0] != tenant)
            if borrowers:
                out.append(ReclaimRequest(tenant, flavor, int(short), tuple(jobs), borrowers))
        return tuple(out)


def plan_cycle(snapshot: QuotaSnapshot, pending: Iterable[PendingJob], order: JobOrder | None = None,
               *, explain: bool = True) -> QuotaPlan:
    """Reserve, in order, every pending job that fits quota; explain the rest (pure)."""
    chosen = order or FairShareOrder()
    cycle = QuotaCycle(snapshot, build_queues(snapshot.tenancy, pending, chosen), chosen, explain=explain)
    while (candidate := cycle.next_candidate()) is not None:
        cycle.reserve(candidate)
    return cycle.finish()


def order_pending(snapshot: QuotaSnapshot, pending: Iterable[PendingJob], order: JobOrder | None = None) -> list[str]:
    """Job ids in queue order, as a cycle would visit them (before any reservation)."""
    chosen = order or FairShareOrder()
    book = QuotaBook.from_usage(snapshot.tenancy, snapshot.usage)
    queues, tiers = split_by_tier(book, build_queues(snapshot.tenancy, pending, chosen))
    shares = tenant_shares(snapshot, queues)
    keyed = [((tiers[qi], *chosen.merged_key(k, shares.get(q.tenant, 0.0))), job.job_id)
             for qi, q in enumerate(queues) for k, job in q.entries]
    return [job_id for _, job_id in sorted(keyed)]


def build_queues(tenancy: Tenancy, pending: Iterable[PendingJob], order: JobOrder) -> list[PendingQueue]:
    groups: dict[tuple[str, str], list[tuple[SortKey, PendingJob]]] = {}
    priorities, tenant_key = tenancy.priority_classes, order.tenant_key
    for job in pending:
        key = tenant_key(job, priorities.get(job.priority_class, UNKNOWN_PRIORITY))
        group = (job.tenant, job.ask.options[0][0])
        if group in groups:
            groups[group].append((key, job))
        else:
            groups[group] = [(key, job)]
    queues = []
    for (tenant, flavor), entries in sorted(groups.items()):
        entries.sort()  # keys are unique (they end in the job id), so jobs are never compared
        sizes = [job.ask.options[0][1] for _, job in entries]
        queues.append(PendingQueue(tenant, flavor, entries, min(sizes), max(sizes),
                                   all(len(job.ask.options) == 1 for _, job in entries)))
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


def waiting_list(records: list, priorities: Mapping[str, int]) -> tuple[WaitingJob, ...]:
    """``(key, job, category, reason)`` records sorted by key, numbered, with the count of waiting jobs
    of a higher priority class ahead of each."""
    records.sort(key=lambda record: record[0])
    values = sorted(set(priorities.values()))
    higher = {value: 0 for value in values}  # waiting jobs so far with a priority above ``value``
    out = []
    for position, (_, job, category, reason) in enumerate(records, start=1):
        value = priorities.get(job.priority_class, values[0] - 1 if values else 0)
        out.append(WaitingJob(job.job_id, job.tenant, position, higher.get(value, position - 1), category, reason))
        for other in values:
            if other < value:
                higher[other] += 1
            else:
                break
    return tuple(out)
