"""All of admission's SQL: authentication failures, the tenants' rate buckets and the request ids that
make a retried submission create no second job; and the tenancy in force as admission reads it."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from gpusched_common.stores.tenancy import TenancyStore

from gpusched_core.quota import Tenancy
from services.admission.core import Bucket, Submission

log = logging.getLogger(__name__)


async def record_auth_failure(conn: asyncpg.Connection, submission: Submission, key_id: str | None, reason: str,
                              now: datetime) -> None:
    # counted and auditable; the signature and the secret are never stored or logged
    await conn.execute(
        "INSERT INTO admission_auth_failures (at, job_id, key_id, claimed_tenant, reason) VALUES ($1, $2, $3, $4, $5)",
        now, submission.job_id, key_id, submission.tenant_hint, reason)
    log.warning("rejected submission %s: %s", submission.job_id, reason)


async def lock_bucket(conn: asyncpg.Connection, tenant: str) -> Bucket | None:
    """The tenant's rate bucket, locked until the transaction ends (None: it never submitted)."""
    row = await conn.fetchrow("SELECT tokens, updated_at FROM admission_rate_buckets WHERE tenant = $1 FOR UPDATE",
                              tenant)
    return Bucket(row["tokens"], row["updated_at"]) if row else None


async def save_bucket(conn: asyncpg.Connection, tenant: str, bucket: Bucket) -> None:
    await conn.execute(
        "INSERT INTO admission_rate_buckets (tenant, tokens, updated_at) VALUES ($1, $2, $3)"
        " ON CONFLICT (tenant) DO UPDATE SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at",
        tenant, bucket.tokens, bucket.updated_at)


async def is_repeat(conn: asyncpg.Connection, tenant: str, submission: Submission) -> bool:
    """True when this tenant's request id already created another job."""
    job_id = await conn.fetchval(
        "INSERT INTO submission_requests (tenant, request_id, job_id) VALUES ($1, $2, $3)"
        " ON CONFLICT (tenant, request_id) DO UPDATE SET request_id = EXCLUDED.request_id RETURNING job_id",
        tenant, submission.request_id, submission.job_id)
    return job_id != submission.job_id


class TenancyReader:
    """The newest revision quota installed (``TenancyStore.read``, which parses each revision once), looked
    up again at most every ``refresh_s`` seconds, so a new revision reaches admission within that time."""

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
