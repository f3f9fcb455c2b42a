"""Why a job waits, in words a user reads: one stable reason (no queue counts, so an unchanged reason
is not recorded twice) plus, in ``describe``, the job's place in the queue."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from enum import Enum
from operator import itemgetter
from typing import Any, NamedTuple

from .ledger import QuotaBook
from .units import format_gpus


class WaitCategory(str, Enum):
    UNKNOWN_TENANT = "unknown_tenant"
    PRIORITY_CLASS = "priority_class_not_allowed"
    NEVER_FITS = "never_fits"
    BORROWING_LIMIT = "borrowing_limit"
    RECLAIMING = "reclaiming"
    COHORT_EXHAUSTED = "cohort_exhausted"
    CAPACITY = "capacity"
    FAIR_SHARE = "fair_share"  # fits quota, held back while another tenant's work waits for room (``backfill``)


WAITING_FOR_CAPACITY = "fits quota; waiting for capacity"
REASON_REFRESH_S = 30.0  # a reason whose figures alone moved is recorded again at most this often

_FIGURES = re.compile(r"\d+(?:[.,]\d+)*")


def reason_kind(reason: str) -> str:
    """The reason with its figures blanked: ``tenant a at quota (3/4 H100)`` and ``(4/4 H100)`` are one kind."""
    return _FIGURES.sub("#", reason)


def worth_recording(last: str | None, last_at_s: float | None, reason: str, now_s: float,
                    refresh_s: float = REASON_REFRESH_S) -> bool:
    """Whether a waiting job's new ``reason`` goes in its stream: always when it differs in kind from the one
    last recorded (another wait: a limit, reclaiming, capacity), and when only its figures moved (usage
    growing while thousands of the tenant's jobs wait, each cycle) once ``refresh_s`` passed since the last,
    so a burst writes each waiting job's reason a bounded number of times, not once per cycle."""
    if last is None or last_at_s is None:
        return reason != last
    if reason == last:
        return False
    return reason_kind(reason) != reason_kind(last) or now_s - last_at_s >= refresh_s


class WaitingJob(NamedTuple):
    """A job left waiting by a cycle (a named tuple: a planning cycle makes thousands). ``position`` is 1-based among waiting jobs in queue order;
    ``ahead_higher_priority`` counts the waiting jobs ahead of it with a higher priority class."""

    job_id: str
    tenant: str
    position: int
    ahead_higher_priority: int
    category: WaitCategory
    reason: str

    def describe(self) -> str:
        """``#13 in queue, behind 12 jobs of higher priority: tenant team-a at quota (...)``."""
        where = f"#{self.position} in queue"
        if self.ahead_higher_priority:
            noun = "job" if self.ahead_higher_priority == 1 else "jobs"
            where += f", behind {self.ahead_higher_priority} {noun} of higher priority"
        return f"{where}: {self.reason}"


def quota_block(book: QuotaBook, tenant: str, flavor: str, units: int, claimed: int) -> tuple[WaitCategory, str]:
    """Category and reason for a job of ``units`` of ``flavor`` that does not fit ``tenant``'s quota.
    ``claimed``: units of the tenant's earlier jobs this cycle that already wait for a reclaim."""
    used, nominal = book.used(tenant, flavor), book.nominal(tenant, flavor)
    cap = book.borrowing_limit(tenant, flavor)
    ever = book.most_ever(tenant, flavor)
    need, f = format_gpus(units), flavor
    if units > ever:
        limit = f" (nominal {format_gpus(nominal)} + borrowing {format_gpus(cap)})" if cap is not None else ""
        return WaitCategory.NEVER_FITS, (
            f"job needs {need} {f} but tenant {tenant} can never hold more than {format_gpus(ever)}{limit}")
    if cap is not None and used + units > nominal + cap:
        return WaitCategory.BORROWING_LIMIT, (
            f"tenant {tenant} at its limit ({format_gpus(used)}/{format_gpus(nominal)} {f} + borrowing "
            f"{format_gpus(cap)}); job needs {need}")
    if used + claimed + units <= nominal:
        return WaitCategory.RECLAIMING, (
            f"tenant {tenant} under quota ({format_gpus(used)}/{format_gpus(nominal)} {f}) while others borrow "
            f"its share; reclaim requested")
    lendable = book.available(tenant, flavor) - max(0, nominal - used)
    at = f"tenant {tenant} at quota ({format_gpus(used)}/{format_gpus(nominal)} {f})"
    if used < nominal:
        at = f"tenant {tenant} near quota ({format_gpus(used)}/{format_gpus(nominal)} {f})"
    if lendable <= 0:
        return WaitCategory.COHORT_EXHAUSTED, f"{at} and cohort has nothing to lend"
    return WaitCategory.COHORT_EXHAUSTED, f"{at}; cohort can lend {format_gpus(lendable)}, job needs {need}"


def not_allowed(tenant: str, priority_class: str, allowed: frozenset[str]) -> str:
    return (f"priority class {priority_class!r} is not allowed for tenant {tenant} "
            f"(allowed: {', '.join(sorted(allowed))})")


def unknown_tenant(tenant: str) -> str:
    return f"tenant {tenant} is not in the tenancy file"


class WaitingRun(NamedTuple):
    """The tail of a settled queue: jobs already in order that share ``tier`` and ``share``, whose reason
    depends only on (priority class, units): ``reasons`` maps each such pair present to it."""

    tier: int
    share: float
    entries: Sequence[tuple[tuple, Any]]  # (tenant key, PendingJob)
    reasons: Mapping[tuple[str, int], tuple[WaitCategory, str]]


class WaitingRecords:
    """The jobs a cycle left waiting, collected cheaply: single ``(key, job, category, reason)`` records
    (the walk) and ``WaitingRun``s (settled queues, usually most of the waiting jobs). ``reasons()``
    yields each job's reason without ordering anything (what the live service records); ``ranked()``
    sorts and numbers them (positions, for a reader). Immutable once the cycle has finished."""

    __slots__ = ("_records", "_runs", "_priorities", "_merged_key")

    def __init__(self, records: list, runs: list[WaitingRun], priorities: Mapping[str, int],
                 merged_key: Callable[[tuple, float], tuple]) -> None:
        self._records, self._runs, self._priorities, self._merged_key = records, runs, priorities, merged_key

    def __len__(self) -> int:
        return len(self._records) + sum(len(run.entries) for run in self._runs)

    def reasons(self) -> Iterator[tuple[Any, WaitCategory, str]]:
        """``(job, category, reason)`` for every waiting job, in no particular order."""
        for _, job, category, reason in self._records:
            yield job, category, reason
        for run in self._runs:
            table = run.reasons
            for _, job in run.entries:
                yield (job, *table[(job.priority_class, job.ask.options[0][1])])

    def ranked(self) -> tuple[WaitingJob, ...]:
        """Every waiting job in queue order with its position (see ``waiting_list``)."""
        records = list(self._records)
        merged_key = self._merged_key
        for tier, share, entries, table in self._runs:
            records += [((tier, *merged_key(tenant_key, share)), job,
                         *table[(job.priority_class, job.ask.options[0][1])]) for tenant_key, job in entries]
        return waiting_list(records, self._priorities)


NO_WAITING = WaitingRecords([], [], {}, lambda key, share: key)


def waiting_list(records: list, priorities: Mapping[str, int]) -> tuple[WaitingJob, ...]:
    """``(key, job, category, reason)`` records sorted by key, numbered, with the count of waiting jobs
    of a higher priority class ahead of each."""
    records.sort(key=itemgetter(0))  # already sorted runs (the walk, each settled queue): timsort merges them
    values = sorted(set(priorities.values()))
    # per priority class: its slot in ``higher`` (None when unknown: every job ahead counts) and the
    # slots of the lower values, whose counts each waiting job of the class raises
    slots = {value: i for i, value in enumerate(values)}
    higher = [0] * len(values)  # waiting jobs so far with a priority above values[i]
    classes: dict[str, tuple[int | None, range]] = {}
    new = tuple.__new__  # WaitingJob(...) without the Python-level __new__ of a named tuple: same value
    out = []
    for position, (_, job, category, reason) in enumerate(records, start=1):
        klass = job.priority_class
        info = classes.get(klass)
        if info is None:
            value = priorities.get(klass)
            slot = slots.get(value) if value is not None else None
            info = classes[klass] = (slot, range(slot if slot is not None else 0))
        slot, raised = info
        ahead = higher[slot] if slot is not None else position - 1
        out.append(new(WaitingJob, (job.job_id, job.tenant, position, ahead, category, reason)))
        for other in raised:
            higher[other] += 1
    return tuple(out)
