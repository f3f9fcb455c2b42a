"""Plain-text tables for the CLI, the simulators and the benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value and math.isfinite(value) and abs(value) < 0.01:
            # a small ratio keeps two significant digits (0.0018, not 0.00)
            digits = 1 - math.floor(math.log10(abs(value)))
            return f"{value:.{digits}f}" if digits <= 12 else f"{value:.2g}"
        return f"{value:.2f}"
    return str(value)
