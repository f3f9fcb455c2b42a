"""The reservation cycle: walk pending work in order and reserve what fits quota.

``plan_cycle`` is what the quota service calls: it reserves every job that fits (placement decides
capacity afterwards) and explains every job left waiting. ``QuotaCycle`` is the same walk one
candidate at a time, for a caller that also checks capacity before it reserves (the simulator):
``next_candidate()`` returns the next job, in order, that fits quota now; the caller then calls
``reserve`` or ``defer``; ``finish()`` returns the plan.

Guarantees: a reservation is made only when ``units <= available`` (see ``model``), so no tenant
exceeds nominal + borrowing and no cohort lends more than it has; jobs of tenants under their
nominal quota come first (``ordering``), and when borrowers hold what such a tenant is owed, the
plan carries a ``ReclaimRequest`` for the preemption service. Inputs are never mutated.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from operator import itemgetter

from .backfill import BlockedWork, FairBackfill
from .fairness import fair_shares, queue_demand
from .ledger import QuotaBook
from .ordering import FairShareOrder, JobOrder, PendingJob, SortKey
from .queues import PendingQueue, build_queues, split_by_tier
from .reasons import (
    NO_WAITING,
    WAITING_FOR_CAPACITY,
    WaitCategory,
    WaitingJob,
    WaitingRecords,
    WaitingRun,
    not_allowed,
    quota_block,
    unknown_tenant,
)
from .snapshot import QuotaSnapshot
from .units import format_gpus, gpu_equivalents


@dataclass(frozen=True, slots=True)
class Reservation:
    """Quota reserved for a job: persist it with the job (``QuotaReserved``) and charge the ledger.
    ``borrowed_units``: the part above the tenant's nominal quota (reclaimable by others)."""

    job_id: str
    tenant: str
    flavor: str
    units: int
    borrowed_units: int
    geq: float


@dataclass(frozen=True, slots=True)
class ReclaimRequest:
    """For the preemption service: free ``units`` of ``flavor`` that ``borrowers`` (tenant, borrowed
    units; most first) hold above their nominal quota, so ``tenant`` gets its nominal share."""

    tenant: str
    flavor: str
    units: int
    for_jobs: tuple[str, ...]
    borrowers: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Candidate:
    job: PendingJob
    flavor: str
    units: int
    key: SortKey


@dataclass(frozen=True)
class QuotaPlan:
    """``waiting_jobs``: the jobs left waiting (none when the cycle ran without explain). ``reasons()``
    gives each one's reason at the cost of a loop; ``waiting`` also ranks them (position, jobs of higher
    priority ahead), which sorts every waiting job: computed on first use."""

    order: str
    reservations: tuple[Reservation, ...]
    reclaims: tuple[ReclaimRequest, ...]
    usage: Mapping[str, Mapping[str, int]]  # reserved units per tenant per flavor after the plan
    waiting_jobs: WaitingRecords = field(default=NO_WAITING, repr=False, compare=False)

    @cached_property
    def waiting(self) -> tuple[WaitingJob, ...]:
        """Waiting jobs in queue order, numbered."""
        return self.waiting_jobs.ranked()

    def reasons(self) -> Iterator[tuple[PendingJob, WaitCategory, str]]:
        """``(job, category, reason)`` for every waiting job, unordered."""
        return self.waiting_jobs.reasons()


@dataclass(slots=True)
class ReclaimClaim:
    """What a tenant under its nominal quota has claimed of one flavor this cycle toward a reclaim: the
    units of its waiting jobs that fit its nominal quota but not what is free, and those jobs, in order.
    Borrowers may not take what is claimed (``_owed``); what is short becomes a ``ReclaimRequest``."""

    units: int = 0
    jobs: list[str] = field(default_factory=list)

    def add(self, job_id: str, units: int) -> None:
        self.units += units
        self.jobs.append(job_id)


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
        self._queue_shares = [self._shares.get(queue.tenant, 0.0) for queue in self._queues]
        self._merged_key = order.merged_key
        self._heap: list[tuple[SortKey, int, int]] = [
            (self._key(qi, queue.entries[0][0]), qi, 0) for qi, queue in enumerate(self._queues) if queue.entries]
        heapq.heapify(self._heap)
        self._reserved: list[Reservation] = []
        self._records: list[tuple[SortKey, PendingJob, WaitCategory, str]] = []
        self._runs: list[WaitingRun] = []  # settled queues' tails (see ``_record_rest``)
        self._stash: list[tuple[int, int]] = []  # (queue, first position) left out of the walk
        self._blocked: dict[tuple[str, str], int] = {}  # smallest units that did not fit, per tenant/flavor
        self._claims: dict[tuple[str, str], ReclaimClaim] = {}  # per (tenant, flavor) under nominal quota
        self._refusals: dict[tuple[str, str], tuple[WaitCategory, str] | None] = {}
        self._reasons: dict[tuple, tuple[WaitCategory, str]] = {}
        self._open: Candidate | None = None

    def _key(self, qi: int, tenant_key: SortKey) -> SortKey:
        return (self._tiers[qi], *self._merged_key(tenant_key, self._queue_shares[qi]))

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
        after = before + units
        borrowed = (after - nominal if after > nominal else 0) - (before - nominal if before > nominal else 0)
        geq = gpu_equivalents(units, flavor, self.snapshot.tenancy.gpu_equivalents)
        reservation = Reservation(job.job_id, job.tenant, flavor, units, borrowed, geq)
        self._reserved.append(reservation)
        self._open = None
        return reservation

    def defer(self, candidate: Candidate, reason: str = WAITING_FOR_CAPACITY,
              category: WaitCategory = WaitCategory.CAPACITY) -> None:
        """The caller could not use a candidate that fits quota (e.g. no node has room, or fair backfill
        holds it back)."""
        if self.explain:
            self._records.append((candidate.key, candidate.job, category, reason))
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
        waiting = (WaitingRecords(self._records, self._runs, self.snapshot.tenancy.priority_classes,
                                  self._merged_key) if self.explain else NO_WAITING)
        return QuotaPlan(self.order.name, tuple(self._reserved), self._reclaims(), self.book.snapshot(), waiting)

    # --- internals ------------------------------------------------------------------------------

    def _check(self, job: PendingJob, key: SortKey) -> Candidate | None:
        refusal = self._refusal_of(job.tenant, job.priority_class)
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
            flavor, units = job.ask.options[0]
            reason = (WaitCategory.RECLAIMING, owed_to) if owed_to else self._reason(tenant, flavor, units, claimed)
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
        owed = {t: claim.units for (t, f), claim in self._claims.items()
                if f == flavor and t != tenant and claim.units and tenancy.root_of(t) == root}
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
        claimed = claim.units if claim is not None else 0
        if self.book.used(job.tenant, flavor) + claimed + units <= self.book.nominal(job.tenant, flavor):
            if claim is None:
                claim = self._claims[(job.tenant, flavor)] = ReclaimClaim()
            claim.add(job.job_id, units)
        return claimed

    def _reason(self, tenant: str, flavor: str, units: int, claimed: int) -> tuple[WaitCategory, str]:
        memo = (tenant, flavor, units, claimed, len(self._reserved))
        reason = self._reasons.get(memo)
        if reason is None:
            reason = self._reasons[memo] = quota_block(self.book, tenant, flavor, units, claimed)
        return reason

    def _settle(self, qi: int, pos: int) -> None:
        """Jobs of a queue that left the walk: none fits; claim toward reclaims while the tenant has
        nominal headroom, and with ``explain`` record each with its reason."""
        queue = self._queues[qi]
        tenant, flavor = queue.tenant, queue.flavor
        claim = self._claims.setdefault((tenant, flavor), ReclaimClaim())
        headroom = self.book.nominal(tenant, flavor) - self.book.used(tenant, flavor) - claim.units
        records, explain, entries = self._records, self.explain, queue.entries
        end = len(entries)
        while pos < end and headroom >= queue.min_units:  # jobs that may still claim, one by one
            tenant_key, job = entries[pos]
            refusal = self._refusal_of(job.tenant, job.priority_class)
            if refusal is None:
                units, claimed = job.ask.options[0][1], claim.units
                if units <= headroom:
                    claim.add(job.job_id, units)
                    headroom -= units
                if explain:
                    records.append((self._key(qi, tenant_key), job, *self._reason(tenant, flavor, units, claimed)))
            elif explain:
                records.append((self._key(qi, tenant_key), job, *refusal))
            pos += 1
        if explain and pos < end:
            self._record_rest(qi, entries[pos:], claim.units)
        if not claim.units:
            del self._claims[(tenant, flavor)]

    def _record_rest(self, qi: int, rest: Sequence[tuple[SortKey, PendingJob]], claimed: int) -> None:
        """Record jobs of a settled queue that can no longer claim anything (``claimed`` is final) as one
        run: the reason depends only on the job's priority class (refusal) and units, so it is worked out
        once per such pair present, and nothing is done per job until the plan is read."""
        tenant, flavor = self._queues[qi].tenant, self._queues[qi].flavor
        table: dict[tuple[str, int], tuple[WaitCategory, str]] = {}
        for klass, units in {(job.priority_class, job.ask.options[0][1]) for _, job in rest}:
            table[(klass, units)] = self._refusal_of(tenant, klass) or self._reason(tenant, flavor, units, claimed)
        self._runs.append(WaitingRun(self._tiers[qi], self._queue_shares[qi], rest, table))

    def _refusal_of(self, tenant: str, priority_class: str) -> tuple[WaitCategory, str] | None:
        memo = (tenant, priority_class)
        if memo not in self._refusals:
            self._refusals[memo] = self._refusal(tenant, priority_class)
        return self._refusals[memo]

    def _refusal(self, name: str, priority_class: str) -> tuple[WaitCategory, str] | None:
        """Why a tenant's job of a class can never be considered (unknown tenant, class not allowed), or None."""
        tenant = self.snapshot.tenancy.tenants.get(name)
        if tenant is None or not tenant.is_leaf:
            return WaitCategory.UNKNOWN_TENANT, unknown_tenant(name)
        if priority_class not in tenant.priority_classes:
            return WaitCategory.PRIORITY_CLASS, not_allowed(name, priority_class, tenant.priority_classes)
        return None

    def _queue_exhausted(self, queue: PendingQueue) -> bool:
        blocked = self._blocked.get((queue.tenant, queue.flavor))
        return queue.single_option and blocked is not None and queue.min_units >= blocked

    def _reclaims(self) -> tuple[ReclaimRequest, ...]:
        out = []
        borrowing: dict[tuple[str, str], list[tuple[str, int]]] = {}  # (root, flavor) -> borrowers
        for (tenant, flavor), claim in sorted(self._claims.items()):
            claimed, jobs = claim.units, claim.jobs
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
               *, explain: bool = True, blocked: Iterable[BlockedWork] = (),
               fair_margin: float | None = None) -> QuotaPlan:
    """Reserve, in order, every pending job that fits quota; explain the rest (pure). With ``fair_margin``,
    backfill is fair (``backfill``): while ``blocked`` work waits for room, a job that would take its
    tenant past the share at which that work could preempt it waits (``WaitCategory.FAIR_SHARE``)."""
    chosen = order or FairShareOrder()
    queues = build_queues(snapshot.tenancy, pending, chosen)
    backfill = None
    if fair_margin is not None and (blocked := tuple(blocked)):
        backfill = FairBackfill(snapshot, queues, fair_margin)
        for work in blocked:
            backfill.blocked_reserved(work.tenant, work.flavor, work.priority)
    cycle = QuotaCycle(snapshot, queues, chosen, explain=explain,
                       shares=backfill.shares if backfill is not None else None)  # worked out once
    while (candidate := cycle.next_candidate()) is not None:
        hold = backfill.holds_back(candidate.job, candidate.flavor, candidate.units) if backfill else None
        if hold is not None:
            cycle.defer(candidate, hold.reason(), WaitCategory.FAIR_SHARE)
            continue
        cycle.reserve(candidate)
        if backfill is not None:
            backfill.started(candidate.job.tenant, candidate.flavor, candidate.units)
    return cycle.finish()


def order_pending(snapshot: QuotaSnapshot, pending: Iterable[PendingJob], order: JobOrder | None = None) -> list[str]:
    """Job ids in queue order, as a cycle would visit them (before any reservation)."""
    chosen = order or FairShareOrder()
    book = QuotaBook.from_usage(snapshot.tenancy, snapshot.usage)
    queues, tiers = split_by_tier(book, build_queues(snapshot.tenancy, pending, chosen))
    shares = tenant_shares(snapshot, queues)
    merged_key = chosen.merged_key
    keyed = []
    for qi, q in enumerate(queues):
        tier, share = tiers[qi], shares.get(q.tenant, 0.0)
        keyed += [((tier, *merged_key(k, share)), job.job_id) for k, job in q.entries]
    keyed.sort(key=itemgetter(0))  # keys are unique (they end in the job id)
    return [job_id for _, job_id in keyed]


def tenant_shares(snapshot: QuotaSnapshot, queues: Sequence[PendingQueue]) -> dict[str, float]:
    """Each queued tenant's fair share: its deficit against its fair entitlement (``fairness``)."""
    return fair_shares(snapshot, queue_demand(snapshot, queues), {q.tenant for q in queues})
