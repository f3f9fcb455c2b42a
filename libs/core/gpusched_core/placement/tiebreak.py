"""Deterministic pseudo-random tie-breaking: no global random state, no clock.

A key for (salt, index) comes from the SplitMix64 finaliser; the salt mixes a seed with a stable
hash (CRC-32) of the request id. Among equally scored nodes the one with the smallest key wins, so
ties spread like a random choice yet the same inputs always give the same node.
"""

from __future__ import annotations

import zlib

import numpy as np

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def salt_for(request_id: str, seed: int) -> int:
    """A 64-bit salt from a request id and a seed (stable across processes, unlike ``hash``)."""
    crc = zlib.crc32(request_id.encode("utf-8"))
    return (crc * _GOLDEN + (seed & _MASK64) * 0xBF58476D1CE4E5B9 + len(request_id)) & _MASK64


def keys(indices: np.ndarray, salt: int) -> np.ndarray:
    """uint64 keys of ``indices`` under ``salt`` (SplitMix64 of salt + index * golden ratio)."""
    x = indices.astype(np.uint64) * np.uint64(_GOLDEN) + np.uint64(salt & _MASK64)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def pick_best(values: np.ndarray, node_indices: np.ndarray, salt: int | None) -> tuple[int, int]:
    """Position of the highest value and the number tied for it.

    Ties go to the smallest key under ``salt``, or, when ``salt`` is None, to the first node in
    snapshot order (``node_indices`` ascending).
    """
    best = values.max()
    if np.isnan(best):  # a NaN score never wins
        values = np.where(np.isnan(values), -np.inf, values)
        best = values.max()
    tied = (values == best).nonzero()[0]
    if tied.size == 1 or salt is None:
        return int(tied[0]), int(tied.size)
    winner = tied[np.argmin(keys(node_indices[tied], salt))]
    return int(winner), int(tied.size)
