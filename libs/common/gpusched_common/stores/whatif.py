"""What the what-if replay (``gpusched_core.whatif``, POST /v1/whatif) reads of the cluster's history: the
jobs submitted in a window, as rows of the jobs read model (the columns GET /v1/jobs serves that the
replay needs), and today's nodes (``cluster.node_inventory``). Read in one snapshot, by the gateway's role
(migration 017 grants ``jobs``, ``nodes``, ``gpus`` and ``gpu_allocations``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from gpusched_common.stores.cluster import node_inventory


@dataclass(frozen=True)
class WhatIfHistory:
    """``jobs``: the window's rows, oldest first (empty when there are more than the bound); ``total``: how
    many the window holds; ``nodes``: every registered node as ``node_inventory`` gives it."""

    jobs: list[dict[str, Any]]
    total: int
    nodes: list[dict[str, Any]]

    def over(self, most: int) -> bool:
        return self.total > most


async def whatif_history(conn: asyncpg.Connection, since: datetime, until: datetime, tenant: str | None,
                         most: int) -> WhatIfHistory:
    """The jobs of ``tenant`` (None: all) submitted in ``[since, until)``, unless there are more than ``most``
    (then only how many), and today's nodes."""
    total = await conn.fetchval(
        "SELECT count(*) FROM jobs WHERE submitted_at >= $1 AND submitted_at < $2 AND ($3::text IS NULL OR tenant = $3)",
        since, until, tenant)
    rows: list[dict[str, Any]] = []
    if total <= most:
        rows = [dict(r) for r in await conn.fetch(
            "SELECT job_id, tenant, status, gpus, gpu_model, priority, submitted_at, started_at, finished_at"
            " FROM jobs WHERE submitted_at >= $1 AND submitted_at < $2 AND ($3::text IS NULL OR tenant = $3)"
            " ORDER BY submitted_at, job_id LIMIT $4", since, until, tenant, most)]
    return WhatIfHistory(rows, total, await node_inventory(conn))
