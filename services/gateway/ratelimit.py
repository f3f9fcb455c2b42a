"""Per-principal token buckets, kept in the gateway's memory (one process: a restart refills them). Each
kind of request (submissions, reads) has its own budget, so a program submitting at rate can still read;
the buckets themselves are ``gpusched_core.rates``."""

from __future__ import annotations

from collections import OrderedDict
from datetime import datetime

from gpusched_core.rates import Bucket, RateLimit, take

MAX_PRINCIPALS = 100_000  # the least recently seen are forgotten beyond this (their bucket refills: no harm)


class PrincipalLimiter:
    def __init__(self, limits: dict[str, RateLimit]) -> None:
        self._limits = limits
        self._buckets: OrderedDict[tuple[str, str], Bucket] = OrderedDict()

    def take(self, kind: str, subject: str, cost: float, now: datetime) -> float | None:
        """None when the request may go on; else the seconds until ``cost`` tokens are there again."""
        limit = self._limits[kind]
        key = (kind, subject)
        ok, bucket = take(self._buckets.get(key), limit, now, cost)
        self._buckets[key] = bucket
        self._buckets.move_to_end(key)
        if len(self._buckets) > MAX_PRINCIPALS:
            self._buckets.popitem(last=False)
        if ok:
            return None
        return (min(cost, limit.burst) - bucket.tokens) / limit.per_s if limit.per_s > 0 else float("inf")
