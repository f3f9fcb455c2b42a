"""Time-decayed usage for fair share (Slurm-style): GEQ-seconds that halve every ``half_life_s``.

The history of a tenant is ``value(t) = integral of rate(s) * 2 ** (-(t - s) / H) ds`` over the past,
kept as ``(geq_s per flavor, as_of_s)`` and advanced exactly over each interval in which the rate
(the tenant's reserved GEQ) is constant. ``average_rate = value * ln 2 / H`` turns it back into
GPU-equivalents: a tenant holding ``r`` GEQ for much longer than ``H`` has an average rate of ``r``.
Time is always an argument (seconds on any fixed epoch); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class UsageHistory:
    """Decayed GEQ-seconds per flavor of one tenant, as of ``as_of_s``."""

    as_of_s: float
    geq_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    """``2 ** (-elapsed / H)``: 1 for no elapsed time, 0 when there is no memory (``H <= 0``)."""
    if elapsed_s <= 0:
        return 1.0
    if half_life_s <= 0:
        return 0.0
    return 2.0 ** (-elapsed_s / half_life_s)


def decayed(value: float, elapsed_s: float, half_life_s: float) -> float:
    return value * decay_factor(elapsed_s, half_life_s)


def accrued(rate_geq: float, elapsed_s: float, half_life_s: float) -> float:
    """GEQ-seconds gained by holding ``rate_geq`` for ``elapsed_s``, decayed to the interval's end."""
    if elapsed_s <= 0 or rate_geq == 0:
        return 0.0
    if half_life_s <= 0:
        return 0.0
    return rate_geq * half_life_s / LN2 * -math.expm1(-elapsed_s * LN2 / half_life_s)  # exact for tiny steps


def advance(history: UsageHistory, now_s: float, rate_geq: Mapping[str, float], half_life_s: float) -> UsageHistory:
    """The history at ``now_s``, given that the tenant held ``rate_geq`` since ``history.as_of_s``.

    A ``now_s`` earlier than ``as_of_s`` (an out-of-order event) changes nothing."""
    elapsed = now_s - history.as_of_s
    if elapsed <= 0:
        return history
    factor = decay_factor(elapsed, half_life_s)
    out = {flavor: value * factor for flavor, value in history.geq_s.items()}
    for flavor, rate in rate_geq.items():
        gained = accrued(rate, elapsed, half_life_s)
        if gained:
            out[flavor] = out.get(flavor, 0.0) + gained
    return UsageHistory(now_s, MappingProxyType({f: v for f, v in out.items() if v > 1e-12}))


def average_rate(history: UsageHistory, flavor: str, half_life_s: float) -> float:
    """The decayed average GEQ held of ``flavor`` (0 with no memory)."""
    if half_life_s <= 0:
        return 0.0
    return history.geq_s.get(flavor, 0.0) * LN2 / half_life_s
