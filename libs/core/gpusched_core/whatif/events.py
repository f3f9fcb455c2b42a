"""The replay's virtual clock: events come out earliest first, ties in the order they were pushed, so a
replay is deterministic. Each carries the ``epoch`` of the run it belongs to: a run cut short (preempted)
and started again gets a new epoch, so the end of its old run no longer matches and is dropped."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from typing import NamedTuple


class Event(NamedTuple):
    at_s: float
    seq: int  # push order: the tie-break
    kind: int
    item_id: str
    epoch: int


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._pushed = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at_s: float, kind: int, item_id: str, epoch: int = 0) -> None:
        self._pushed += 1
        heapq.heappush(self._heap, Event(at_s, self._pushed, kind, item_id, epoch))

    def next_at(self) -> float:
        """When the earliest event is due (``inf`` when none is queued)."""
        return self._heap[0].at_s if self._heap else math.inf

    def pop_due(self, now_s: float) -> Iterator[Event]:
        """The events due at or before ``now_s``, earliest first (also those pushed while iterating)."""
        while self._heap and self._heap[0].at_s <= now_s:
            yield heapq.heappop(self._heap)

    def discard_stale(self, live: Callable[[Event], bool]) -> None:
        """Drop the earliest events for as long as they are not ``live``."""
        while self._heap and not live(self._heap[0]):
            heapq.heappop(self._heap)
