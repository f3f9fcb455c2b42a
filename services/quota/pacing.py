"""Pacing each cohort's reservation cycles while a backlog goes in.

A cycle reads and ranks its cohort's whole queue, so its cost grows with the queue (about half a second
with 50,000 jobs waiting on a 2-core machine), while a batch of admissions takes milliseconds. One cycle
per batch makes a backlog of N jobs arriving b at a time cost N^2 / b row reads: 50,000 jobs went in at
93 a second. Paced, a cohort's next cycle starts no sooner than ``next_cycle_at`` its last one: a batch in
between queues its jobs and, once it committed, leaves the cycle due then, to one cycle that takes in all
of them (``run_due``: a transaction of its own, from the store alone, as the reconcile pass runs). A cycle
over a short queue takes milliseconds, so pacing delays nothing one could see there.

Pacing is per process and only about when; what a cycle decides is unchanged (the same cycle, over the same
store, a little later), and the reconcile pass still runs every cohort's cycle every few seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

CYCLE_SHARE = 0.5  # at most this share of the time in one cohort's cycles while its jobs keep coming
RETRY_S = 1.0  # a due cycle that failed (the database away, a deadlock with a replica) is due again after this


def next_cycle_at(ended_at: float, took_s: float, share: float = CYCLE_SHARE) -> float:
    """When a cohort's next cycle may start, its last one having taken ``took_s`` up to ``ended_at``: cycles
    back to back take at most ``share`` of the time (pure)."""
    return ended_at + took_s * (1.0 - share) / share


class CyclePacer:
    """When each cohort's cycles ran and which are due; ``clock``: seconds, monotonic."""

    def __init__(self, share: float = CYCLE_SHARE, clock: Callable[[], float] = time.monotonic) -> None:
        self.share, self.clock = share, clock
        self._last: dict[str, tuple[float, float]] = {}  # cohort -> (when its last cycle ended, how long it took)
        self._due: dict[str, float] = {}  # cohort -> when its deferred cycle runs
        self._changed = asyncio.Event()

    def may_run(self, cohort: str) -> bool:
        """Whether a batch runs the cohort's cycle itself now (else it defers it)."""
        last = self._last.get(cohort)
        return last is None or self.clock() >= next_cycle_at(*last, self.share)

    def ran(self, cohort: str, started: float, ended: float) -> None:
        self._last[cohort] = (ended, max(ended - started, 0.0))

    def defer(self, cohort: str) -> None:
        """The cohort's cycle is due when pacing lets it run (call once the batch that queued its jobs committed,
        so that the cycle sees them); a cycle already due keeps its earlier time."""
        last = self._last.get(cohort)
        at = next_cycle_at(*last, self.share) if last is not None else self.clock()
        if at < self._due.get(cohort, float("inf")):
            self._due[cohort] = at
            self._changed.set()

    def retry(self, cohort: str) -> None:
        self._due[cohort] = min(self._due.get(cohort, float("inf")), self.clock() + RETRY_S)
        self._changed.set()

    def due(self) -> list[str]:
        """The cohorts whose cycle is due now, taken off the list (sorted: replicas lock alike)."""
        now = self.clock()
        ready = sorted(cohort for cohort, at in self._due.items() if at <= now)
        for cohort in ready:
            del self._due[cohort]
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
    """Forever: each due cohort's ``cycle`` (its own transaction), timed for the pacer; one that fails is
    reported to ``failed`` and due again shortly."""
    while True:
        await pacer.until_due()
        for cohort in pacer.due():
            started = pacer.clock()
            try:
                await cycle(cohort)
            except Exception as exc:  # noqa: BLE001 - a failed cycle is retried; the loop must go on
                failed(cohort, exc)
                pacer.retry(cohort)
                continue
            pacer.ran(cohort, started, pacer.clock())
