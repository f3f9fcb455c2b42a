"""The virtual clock's event queue, shared by the time-based replays (``queue`` and ``preemption``): the
what-if core's (``gpusched_core.whatif.events``), one queue for every replay.

Events come out earliest first, ties in the order they were pushed, so a replay is deterministic.
Each event carries the ``epoch`` of the run it belongs to: a run cut short (preempted) and started
again gets a new epoch, so the events of its old run stay queued but no longer match; the caller
drops them before reading the next time (``discard_stale``) or ignores them when they come due.
"""

from __future__ import annotations

from gpusched_core.whatif.events import Event, EventQueue

__all__ = ["Event", "EventQueue"]
