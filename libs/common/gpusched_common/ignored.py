"""Messages a consumer ignored rather than believed (not in the event store, numbers out of range), counted
by kind and logged at the 1st, 10th, 100th and every 1,000th, so that a flood costs no log storm."""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger(__name__)


class Ignored:
    def __init__(self, what: str) -> None:
        self.what = what
        self.counts: Counter[str] = Counter()

    def note(self, kind: str, reason: str) -> None:
        self.counts[kind] += 1
        total = sum(self.counts.values())
        if total in (1, 10, 100) or total % 1000 == 0:
            log.warning("ignored %d %s (by type: %s); the latest, a %s: %s", total, self.what, dict(self.counts),
                        kind, reason)

    def __getitem__(self, kind: str) -> int:
        return self.counts[kind]

    def total(self) -> int:
        return sum(self.counts.values())
