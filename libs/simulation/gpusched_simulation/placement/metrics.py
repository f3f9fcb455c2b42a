"""Metrics at arrived-% checkpoints, computed as the FGD artifact's analysis scripts do.

"Arrived x%" means the GPU requested by all pods submitted so far is x% of capacity. The value at
checkpoint x is the mean, over the pods whose arrived % rounds to x, of the allocated GPU % after
that pod (rounded to 2 decimals); when no pod rounds to x, the pods within x +- 1 are used.
Unallocated GPU % is 100 minus that.
"""

from __future__ import annotations

import numpy as np

UNALLOCATED_CHECKPOINTS = (90, 95, 100, 110, 120, 130)
FRAGMENTATION_CHECKPOINTS = (50, 90, 100)


def arrived_pct_rounded(arrived_milli: int, capacity_milli: int) -> float:
    return float(np.round(100.0 * arrived_milli / capacity_milli))


def allocated_pct_at(arrived_milli: np.ndarray, allocated_milli: np.ndarray, capacity_milli: int,
                     checkpoint: int) -> float | None:  # fmt: skip
    """Mean allocated % of the pods whose arrived % rounds to ``checkpoint`` (None if none near)."""
    arrived_pct = np.round(100.0 * arrived_milli / capacity_milli)
    allocated_pct = np.round(100.0 * allocated_milli / capacity_milli, 2)
    window = arrived_pct == checkpoint
    if not window.any():
        window = (arrived_pct >= checkpoint - 1) & (arrived_pct <= checkpoint + 1)
        if not window.any():
            return None
    return round(float(allocated_pct[window].mean()), 2)


def unallocated_pct(arrived_milli: np.ndarray, allocated_milli: np.ndarray, capacity_milli: int,
                    checkpoints: tuple[int, ...] = UNALLOCATED_CHECKPOINTS) -> dict[str, float]:  # fmt: skip
    out = {}
    for checkpoint in checkpoints:
        allocated = allocated_pct_at(arrived_milli, allocated_milli, capacity_milli, checkpoint)
        if allocated is not None:
            out[str(checkpoint)] = round(100.0 - allocated, 2)
    return out
