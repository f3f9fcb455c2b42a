"""All of admission's SQL: authentication failures, the tenants' rate buckets and the request ids that
make a retried submission create no second job (the tenancy in force: ``stores.tenancy.TenancyReader``)."""

from __future__ import annotations

import logging
from datetime import datetime

import asyncpg

from gpusched_core.rates import Bucket
from services.admission.core import Submission

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


async def record_control_refusal(conn: asyncpg.Connection, job_id: str, producer: str | None, tenant: str | None,
                                 reason: str, now: datetime) -> None:
    """A control request (a cancel) whose sender was refused: counted with the submissions' failures."""
    await conn.execute(
        "INSERT INTO admission_auth_failures (at, job_id, key_id, claimed_tenant, reason) VALUES ($1, $2, $3, $4, $5)",
        now, job_id, producer, tenant, reason)
    log.warning("refused a control request for %s: %s", job_id, reason)
