"""Per-tenant submission rate limits as token buckets (pure)."""

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


def take(bucket: Bucket | None, limit: RateLimit, now: datetime) -> tuple[bool, Bucket]:
    """Refill for the time passed (never beyond the burst), then take one token if there is one."""
    if bucket is None:
        tokens = limit.burst
    else:
        elapsed = max(0.0, (now - bucket.updated_at).total_seconds())
        tokens = min(limit.burst, bucket.tokens + elapsed * limit.per_s)
    if tokens >= 1.0:
        return True, Bucket(tokens - 1.0, now)
    return False, Bucket(tokens, now)
