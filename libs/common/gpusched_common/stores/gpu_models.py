"""The GPU models of the cluster, for the doors that check a job's model (admission, the gateway): each
model a registered node reports (placement's ``gpus`` table, nodes in any status: a lost node may come
back) with the largest memory one of its GPUs reports, as a ``gpusched_core.gpu_models.ModelView``
with the operator's catalogue and the models declared before any node has them (the catalogue's, the
tenancy's flavors)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import asyncpg

from gpusched_core.gpu_models import Catalogue, ModelView


async def registered_models(conn: asyncpg.Connection) -> dict[str, int]:
    """Each GPU model registered nodes report and the largest memory (MiB) a GPU of it reports."""
    rows = await conn.fetch("SELECT model, max(memory_mib) AS memory_mib FROM gpus GROUP BY model ORDER BY model")
    return {r["model"]: r["memory_mib"] for r in rows}


class ModelReader:
    """The cluster's models, read again at most every ``refresh_s`` seconds (a node that registers a new
    model is known to its reader within that time)."""

    def __init__(self, catalogue: Catalogue | None = None, refresh_s: float = 1.0) -> None:
        self.catalogue = catalogue or Catalogue()
        self.refresh_s = refresh_s
        self._present: dict[str, int] = {}
        self._checked_at: datetime | None = None

    async def current(self, conn: asyncpg.Connection, now: datetime, declared: Iterable[str] = ()) -> ModelView:
        """The view now: registered models, then the catalogue's and ``declared`` (a tenancy's flavors)."""
        if self._checked_at is None or (now - self._checked_at).total_seconds() >= self.refresh_s:
            self._present = await registered_models(conn)
            self._checked_at = now
        names = [m.name for m in self.catalogue.models]
        return ModelView(dict(self._present), (), self.catalogue).with_declared([*names, *declared])
