"""The commands an agent has already carried out, by event id (pure: the caller passes the time).

A relay that finds the broker lost its data publishes again what it published recently, the same envelopes
with the same event ids, and a consumer whose cluster changed reads the new log from its start: an agent
would see every command of the last minutes a second time. Most are harmless twice (a StartJob of a run
the node has, a PreemptJob of a job stopping), but not an old ReconcileJobs of the current epoch: it lists
the jobs the store expected *then*, and every job started since would be stopped as not assigned. A command
seen before is not carried out again. The window matches the signature window: a command older than that
is refused for its age anyway.
"""

from __future__ import annotations

from collections import OrderedDict

WINDOW_S = 20 * 60.0  # at least the 15-minute replay window of node commands' signatures
MAX_REMEMBERED = 200_000


class SeenCommands:
    def __init__(self, window_s: float = WINDOW_S, limit: int = MAX_REMEMBERED) -> None:
        self._window_s, self._limit = window_s, limit
        self._at: OrderedDict[str, float] = OrderedDict()

    def first_time(self, event_id: str, now: float) -> bool:
        """True the first time ``event_id`` is offered within the window (it is remembered); False after."""
        while self._at and (len(self._at) > self._limit or next(iter(self._at.values())) < now - self._window_s):
            self._at.popitem(last=False)
        if event_id in self._at:
            return False
        self._at[event_id] = now
        return True
