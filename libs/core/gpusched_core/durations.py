"""Durations as people write them (pure): ``90s``, ``30m``, ``2h``, ``7d``, ``1h30m``, or a number of seconds;
how job time limits are given (``--time-limit``, the tenancy file) and said back ("time limit 2h reached")."""

from __future__ import annotations

import re

_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``; ValueError saying what is wrong otherwise (a duration must be positive)."""
    if isinstance(text, bool):
        raise ValueError(f"a duration is a number of seconds or e.g. 90s, 30m, 2h, 7d, got {text!r}")
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        stripped = text.strip()
        match = _DURATION.match(stripped) if stripped else None
        if match is None or not any(match.groups()):
            try:
                seconds = float(stripped)
            except ValueError:
                raise ValueError(f"a duration is a number of seconds or e.g. 90s, 30m, 2h, 7d, got {text!r}") from None
        else:
            seconds = float(sum(int(n) * _UNITS[u] for n, u in zip(match.groups(), "dhms", strict=True) if n))
    if not seconds > 0:
        raise ValueError(f"a duration must be positive, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """``2h``, ``90m`` as ``1h30m``, ``45s``: the exact form of a whole number of seconds."""
    whole = max(0, round(seconds))
    parts = [(whole // 86400, "d"), (whole % 86400 // 3600, "h"), (whole % 3600 // 60, "m"), (whole % 60, "s")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"
