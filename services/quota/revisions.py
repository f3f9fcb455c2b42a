"""The tenancy in force, kept in PostgreSQL: the newest accepted revision, across restarts and replicas.

A decision calls ``TenancyStore.current(conn)`` inside its transaction. That takes the tenancy lock shared
until the transaction ends, so a new revision (``lock_revisions`` takes it exclusively) never lands in the
middle of a decision: every quota process decides with the revision in force, and the limits in
``quota_policy_usage`` are always those of that revision.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_core.quota import Tenancy, load_tenancy
from services.quota.policy_store import apply_limits

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


async def lock_revisions(conn: asyncpg.Connection) -> int | None:
    """Take the tenancy lock exclusively until the transaction ends; the revision in force (None: none)."""
    await conn.execute("SELECT pg_advisory_xact_lock($1)", TENANCY_LOCK)
    return await conn.fetchval("SELECT max(revision) FROM quota_tenancy_revisions")


async def install(conn: asyncpg.Connection, tenancy: Tenancy, document: str, *, source: str,
                  event_id: str | None, now: datetime) -> None:
    """Put ``tenancy`` in force and write its limits. The caller holds ``lock_revisions`` and has checked
    that the revision is newer than the one in force."""
    await conn.execute(
        "INSERT INTO quota_tenancy_revisions (revision, document, source, event_id, applied_at)"
        " VALUES ($1, $2, $3, $4, $5)", tenancy.revision, document, source, event_id, now)
    await apply_limits(conn, tenancy)


async def record_rejection(conn: asyncpg.Connection, *, event_id: str, revision: int | None, source: str | None,
                           problems: tuple[str, ...], now: datetime) -> None:
    await conn.execute(
        "INSERT INTO quota_tenancy_rejections (event_id, revision, source, problems, rejected_at)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING", event_id, revision, source, list(problems), now)
