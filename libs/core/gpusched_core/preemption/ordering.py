"""Which victims are preferred: the ``VictimOrder`` protocol, the orders by name, and set comparison.

An order maps a candidate's facts to a sort key; a smaller key is a cheaper victim. Every key ends
in the job id, so the order is total: the same candidates always sort the same way.

Victim sets of the same size are compared by their keys sorted from the costliest down, smallest
first: the plan whose worst victim is cheapest wins, then the next worst, and so on (so touching one
expensive job is never traded for sparing cheaper ones). Fewer victims always beat more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .model import RunningJob

SortKey = tuple[int | float | str, ...]


@dataclass(frozen=True, slots=True)
class CandidateFacts:
    """What the orders may look at: the job and facts derived from the snapshot and ``now_s``.

    ``lost_work_s``: seconds of work since the last checkpoint (since the run's start when it never
    checkpointed). ``lost_gpu_s``: the same in GPU-seconds (``lost_work_s`` x GPUs held).
    ``borrowing``: the job's tenant uses more than its nominal quota.
    """

    job: RunningJob
    gpu_milli: int
    lost_work_s: float
    borrowing: bool

    @property
    def lost_gpu_s(self) -> float:
        return self.lost_work_s * self.gpu_milli / 1000.0


@runtime_checkable
class VictimOrder(Protocol):
    """A total order on candidates; ``key`` must be deterministic and end in the job id."""

    @property
    def name(self) -> str: ...

    @property
    def criteria(self) -> str:
        """The criteria in order, for the preemptor's reasons."""
        ...

    def key(self, facts: CandidateFacts) -> SortKey: ...


@dataclass(frozen=True)
class DefaultVictimOrder:
    """Cheapest victim first, by:

    1. borrowed usage first (the job's tenant is above its nominal quota);
    2. lower priority first;
    3. less work lost since the last checkpoint (GPU-seconds) first;
    4. younger first (the run started later);
    5. job id (ascending): the total tie-break.
    """

    name: str = "default"
    criteria: str = "borrowed usage, lower priority, less work lost since checkpoint, younger, job id"

    def key(self, facts: CandidateFacts) -> SortKey:
        job = facts.job
        return (0 if facts.borrowing else 1, job.priority, facts.lost_gpu_s, -job.started_at_s, job.job_id)


@dataclass(frozen=True)
class LeastLostWorkOrder:
    """Least work lost first, then borrowed usage, lower priority, younger, job id.

    For clusters where every job checkpoints and lost GPU time is the cost that matters most.
    """

    name: str = "least-lost-work"
    criteria: str = "less work lost since checkpoint, borrowed usage, lower priority, younger, job id"

    def key(self, facts: CandidateFacts) -> SortKey:
        job = facts.job
        return (facts.lost_gpu_s, 0 if facts.borrowing else 1, job.priority, -job.started_at_s, job.job_id)


VICTIM_ORDERS: dict[str, VictimOrder] = {order.name: order for order in (DefaultVictimOrder(), LeastLostWorkOrder())}


def victim_order(name: str) -> VictimOrder:
    """The order registered as ``name``; raises ``KeyError`` naming the known ones."""
    try:
        return VICTIM_ORDERS[name]
    except KeyError:
        raise KeyError(f"unknown victim order {name!r}; known: {', '.join(VICTIM_ORDERS)}") from None


def set_cost(keys: Iterable[SortKey]) -> tuple[int, tuple[SortKey, ...]]:
    """Comparable cost of a victim set: (size, keys from the costliest down); smaller is better."""
    ordered = tuple(sorted(keys, reverse=True))
    return len(ordered), ordered
