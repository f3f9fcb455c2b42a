"""Token buckets (pure): how admission bounds each tenant's submissions and the gateway each principal's
requests. A bucket holds at most ``burst`` tokens, refills at ``per_s``, and a request takes its cost."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_at: datetime


@dataclass(frozen=True)
class RateLimit:
    per_s: float
    burst: float


def take(bucket: Bucket | None, limit: RateLimit, now: datetime, cost: float = 1.0) -> tuple[bool, Bucket]:
    """Refill for the time passed (never beyond the burst), then take ``cost`` tokens if there are as many
    (a request that costs more than the burst never passes)."""
    if bucket is None:
        tokens = limit.burst
    else:
        elapsed = max(0.0, (now - bucket.updated_at).total_seconds())
        tokens = min(limit.burst, bucket.tokens + elapsed * limit.per_s)
    if tokens >= cost:
        return True, Bucket(tokens - cost, now)
    return False, Bucket(tokens, now)
