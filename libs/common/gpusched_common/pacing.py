"""Pacing a service's decision cycles while a backlog goes in: quota's per cohort, placement's over the cluster.

A cycle reads and ranks its whole queue, so its cost grows with the queue (about half a second with 50,000
jobs waiting on a 2-core machine), while a batch of messages takes milliseconds. One cycle per batch makes
a backlog of N jobs arriving b at a time cost N^2 / b row reads: 50,000 jobs went into quota's queue at 93
a second, and into placement's at about 100. Paced, a key's (a cohort's, the cluster's) next cycle starts
no sooner than ``next_cycle_at`` its last one: a batch in between queues its jobs and, once it committed,
leaves the cycle due then, to one cycle that takes in all of them (``run_due``: a transaction of its own,
from the store alone, as a reconcile pass runs). A cycle shorter than ``PACED_FROM_S`` (a short queue)
holds nothing back: every batch runs its own, as a GPU that frees wants.

Pacing is per process and only about when; what a cycle decides is unchanged (the same cycle, over the same
store, a little later), and each service's reconcile pass still runs its cycles every few seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpusched_common.batching import Batch

CYCLE_SHARE = 0.5  # at most this share of the time in one key's cycles while its jobs keep coming
PACED_FROM_S = 0.1  # a cycle shorter than this never holds the next one back (a short queue: every batch cycles)
RETRY_S = 1.0  # a due cycle that failed (the database away, a deadlock with a replica) is due again after this


def next_cycle_at(ended_at: float, took_s: float, share: float = CYCLE_SHARE, paced_from_s: float = 0.0) -> float:
    """When a key's next cycle may start, its last one having taken ``took_s`` up to ``ended_at``: cycles
    back to back take at most ``share`` of the time; one shorter than ``paced_from_s`` holds nothing back
    (a pause after a cycle of milliseconds saves nothing a backlog would feel, and would leave a freed GPU's
    next placement to the due loop's transaction). Pure."""
    if took_s < paced_from_s:
        return ended_at
    return ended_at + took_s * (1.0 - share) / share


class CyclePacer:
    """When each key's cycles (a quota cohort's, placement's) ran and which are due; ``clock``: seconds,
    monotonic."""

    def __init__(self, share: float = CYCLE_SHARE, clock: Callable[[], float] = time.monotonic,
                 paced_from_s: float = PACED_FROM_S) -> None:
        self.share, self.clock, self.paced_from_s = share, clock, paced_from_s
        self._last: dict[str, tuple[float, float]] = {}  # key -> (when its last cycle ended, how long it took)
        self._due: dict[str, float] = {}  # key -> when its deferred cycle runs
        self._changed = asyncio.Event()

    def may_run(self, key: str) -> bool:
        """Whether a batch runs the key's cycle itself now (else it defers it)."""
        last = self._last.get(key)
        return last is None or self.clock() >= next_cycle_at(*last, self.share, self.paced_from_s)

    def ran(self, key: str, started: float, ended: float) -> None:
        self._last[key] = (ended, max(ended - started, 0.0))

    def defer(self, key: str) -> None:
        """The key's cycle is due when pacing lets it run (call once the batch that queued its jobs committed,
        so that the cycle sees them); a cycle already due keeps its earlier time."""
        last = self._last.get(key)
        at = next_cycle_at(*last, self.share, self.paced_from_s) if last is not None else self.clock()
        if at < self._due.get(key, float("inf")):
            self._due[key] = at
            self._changed.set()

    async def run_or_defer(self, key: str, batch: Batch, cycle: Callable[[], Awaitable[None]]) -> None:
        """In a batch's end work: the key's ``cycle`` now, timed, when pacing lets it run; else the cycle is due
        once the batch committed (so that it sees the jobs the batch queued), for ``run_due``."""
        if not self.may_run(key):
            batch.after_commit(f"cycle:{key}", lambda: self.defer(key))
            return
        started = self.clock()
        await cycle()
        self.ran(key, started, self.clock())

    def retry(self, key: str) -> None:
        self._due[key] = min(self._due.get(key, float("inf")), self.clock() + RETRY_S)
        self._changed.set()

    def due(self) -> list[str]:
        """The keys whose cycle is due now, taken off the list (sorted: replicas lock alike)."""
        now = self.clock()
        ready = sorted(key for key, at in self._due.items() if at <= now)
        for key in ready:
            del self._due[key]
        return ready

    def wait_s(self) -> float | None:
        """Seconds until the next due cycle (None: none is due)."""
        return max(min(self._due.values()) - self.clock(), 0.0) if self._due else None

    async def until_due(self) -> None:
        while (wait := self.wait_s()) is None or wait > 0:
            self._changed.clear()
            try:
                async with asyncio.timeout(wait):  # None: until something is deferred
                    await self._changed.wait()
            except TimeoutError:
                pass


async def run_due(pacer: CyclePacer, cycle: Callable[[str], Awaitable[None]],
                  failed: Callable[[str, BaseException], None]) -> None:
    """Forever: each due key's ``cycle`` (its own transaction), timed for the pacer; one that fails is
    reported to ``failed`` and due again shortly."""
    while True:
        await pacer.until_due()
        for key in pacer.due():
            started = pacer.clock()
            try:
                await cycle(key)
            except Exception as exc:  # noqa: BLE001 - a failed cycle is retried; the loop must go on
                failed(key, exc)
                pacer.retry(key)
                continue
            pacer.ran(key, started, pacer.clock())
