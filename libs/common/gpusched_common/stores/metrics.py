"""The metrics service's utilisation samples (``cluster_utilization``), read side: what the CLI's summary
reports of a run."""

from __future__ import annotations

import asyncpg


async def utilization_summary(conn: asyncpg.Connection) -> asyncpg.Record:
    """``mean``: mean GPU utilisation over the samples with any GPU busy (None: no such sample);
    ``peak_busy``: the most GPUs busy at once."""
    return await conn.fetchrow("SELECT avg(mean_utilization) AS mean, max(gpus_busy) AS peak_busy"
                               " FROM cluster_utilization WHERE gpus_busy > 0")
