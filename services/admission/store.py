"""All of admission's SQL: authentication failures, the tenants' rate buckets and the request ids that
make a retried submission create no second job (the tenancy in force: ``stores.tenancy.TenancyReader``)."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from gpusched_core.rates import Bucket
from services.admission.core import Submission, failure_key

log = logging.getLogger(__name__)


async def count_auth_failure(conn: asyncpg.Connection, credential: str | None, reason: str, now: datetime) -> None:
    """One more failure of its kind and credential (``core.failure_key``): a counter, never a row per
    message; the signature and the secret are never stored or logged."""
    kind, named = failure_key(reason, credential)
    failures = await conn.fetchval(
        "INSERT INTO admission_auth_failure_counts (kind, credential, failures, first_at, last_at, last_reason)"
        " VALUES ($1, $2, 1, $3, $3, $4) ON CONFLICT (kind, credential) DO UPDATE SET failures ="
        " admission_auth_failure_counts.failures + 1, last_at = EXCLUDED.last_at, last_reason = EXCLUDED.last_reason"
        " RETURNING failures", kind, named, now, reason[:500])
    if failures in (1, 10, 100) or failures % 1000 == 0:
        log.warning("refused %d message(s) for %s (credential %s); the latest: %s", failures, kind, named, reason[:200])


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


async def record_control_refusal(conn: asyncpg.Connection, job_id: str, producer: str | None, tenant: str | None,
                                 reason: str, now: datetime) -> None:
    """A control request (a cancel) whose sender was refused: counted with the submissions' failures."""
    await count_auth_failure(conn, producer, reason, now)
