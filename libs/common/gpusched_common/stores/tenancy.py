"""The tenancy in force, kept in PostgreSQL by the quota service: the newest accepted revision, across
restarts and replicas. Quota owns ``quota_tenancy_revisions``; admission and preemption read it here.

A decision calls ``TenancyStore.current(conn)`` inside its transaction. That takes the tenancy lock shared
until the transaction ends, so a new revision (``lock_revisions`` takes it exclusively) never lands in the
middle of a decision: every quota process decides with the revision in force, and the limits in
``quota_policy_usage`` are always those of that revision.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_core.quota import Tenancy, load_tenancy

TENANCY_LOCK = 727_400  # advisory lock id: shared by decisions, exclusive while a revision is installed


class NoTenancy(RuntimeError):
    """No revision is in force (the quota service starts with one; see ``app``)."""


class TenancyStore:
    """Reads the revision in force; parses a revision once, when it first sees it."""

    def __init__(self) -> None:
        self._parsed: Tenancy | None = None

    async def current(self, conn: asyncpg.Connection) -> Tenancy:
        await conn.execute("SELECT pg_advisory_xact_lock_shared($1)", TENANCY_LOCK)
        tenancy = await self.read(conn)
        if tenancy is None:
            raise NoTenancy("no tenancy is in force: start the quota service with GPUSCHED_TENANTS_FILE, or "
                            "publish one with `gpusched tenants apply FILE`")
        return tenancy

    async def read(self, conn: asyncpg.Connection) -> Tenancy | None:
        """The newest revision without the lock (None: none yet), for readers outside quota's decisions."""
        revision = await conn.fetchval("SELECT max(revision) FROM quota_tenancy_revisions")
        if revision is None:
            return None
        if self._parsed is None or self._parsed.revision != revision:
            document = await conn.fetchval("SELECT document FROM quota_tenancy_revisions WHERE revision = $1",
                                           revision)
            self._parsed = load_tenancy(document)  # it was valid when it was installed
        return self._parsed


async def update_outcome(conn: asyncpg.Connection, event_id: str) -> tuple[str, list[str]] | None:
    """``("applied", [])``, ``("rejected", problems)``, or None while the quota service has not decided."""
    if await conn.fetchval("SELECT 1 FROM quota_tenancy_revisions WHERE event_id = $1", event_id):
        return "applied", []
    problems = await conn.fetchval("SELECT problems FROM quota_tenancy_rejections WHERE event_id = $1", event_id)
    return ("rejected", list(problems)) if problems is not None else None


class TenancyReader:
    """The newest revision quota installed (``TenancyStore.read``, which parses each revision once), looked
    up again at most every ``refresh_s`` seconds, so a new revision reaches its reader (admission, the gateway) within that time."""

    def __init__(self, refresh_s: float = 1.0) -> None:
        self.refresh_s = refresh_s
        self._store = TenancyStore()
        self._tenancy: Tenancy | None = None
        self._checked_at: datetime | None = None

    async def current(self, conn: asyncpg.Connection, now: datetime) -> Tenancy | None:
        """The tenancy in force (None before quota installed one: then quota alone decides)."""
        if self._checked_at is None or (now - self._checked_at).total_seconds() >= self.refresh_s:
            self._checked_at = now
            self._tenancy = await self._store.read(conn)
        return self._tenancy
