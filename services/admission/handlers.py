"""Admission's Kafka edge: parse, authenticate, rate-limit, dedupe, decide, append with the outbox (the
transaction and the offset commit around it belong to the batch consumer)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from gpusched_common import decider
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.credentials import KEY_ID_HEADER, TenantKey, Verdict, verify
from gpusched_common.jobs import append_job_events, load_job
from gpusched_common.messaging import Incoming, PoisonMessage
from gpusched_common.store import claim

from services.admission.core import AdmissionLimits, Submission, Unparseable, check_identity, parse_submission
from services.admission.ratelimit import Bucket, RateLimit, take
from services.admission.tenancy import TenancyReader, check_against_tenancy

SERVICE = "admission"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdmissionPolicy:
    limits: AdmissionLimits
    rate: RateLimit
    keys: dict[str, TenantKey] | None  # None: authentication is off (development only)


def make_submission_handler(policy: AdmissionPolicy, clock: Callable[[], datetime],
                            tenancy: TenancyReader | None = None) -> TxHandler:
    tenancy = tenancy or TenancyReader()

    async def on_submitted(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        try:
            submission = parse_submission(message.value, policy.limits)
        except Unparseable as exc:
            raise PoisonMessage(str(exc)) from exc
        now = clock()
        if not await claim(conn, SERVICE, submission.event_id):
            return
        verdict = verify(policy.keys, message.headers, message.value) if policy.keys is not None else Verdict(None, None)
        reasons = check_identity(submission.spec.tenant if submission.spec else submission.tenant_hint,
                                 verdict.tenant, verdict.reason)
        if reasons:
            await record_auth_failure(conn, submission, message, reasons[0], now)
        tenant = submission.spec.tenant if submission.spec else None
        if not reasons and tenant is not None and not await take_rate_token(conn, tenant, policy.rate, now):
            reasons = (f"tenant {tenant} exceeded its submission rate ({policy.rate.per_s:g}/s, "
                       f"burst {policy.rate.burst:g})",)
        if not reasons and submission.spec is not None:
            in_force = await tenancy.current(conn, now)
            if in_force is not None:
                reasons = check_against_tenancy(submission.job_id, submission.spec, in_force)
        if not reasons and tenant and submission.request_id and await is_repeat(conn, tenant, submission):
            log.info("submission %s repeats request %s of tenant %s; no new job", submission.job_id,
                     submission.request_id, tenant)
            return
        command = decider.RegisterSubmission(
            spec=None if reasons else submission.spec, submitted_at=submission.submitted_at or now,
            rejection_reasons=submission.reasons + reasons, tenant_hint=submission.tenant_hint,
            request_id=submission.request_id, submitted_by=message.headers.get(KEY_ID_HEADER) if verdict.tenant else None,
        )
        state = await load_job(conn, submission.job_id)
        await append_job_events(conn, state, decider.decide(state, command, now), producer=SERVICE, now=now)

    return on_submitted


async def record_auth_failure(conn: asyncpg.Connection, submission: Submission, message: Incoming, reason: str,
                              now: datetime) -> None:
    # counted and auditable; the signature and the secret are never stored or logged
    await conn.execute(
        "INSERT INTO admission_auth_failures (at, job_id, key_id, claimed_tenant, reason) VALUES ($1, $2, $3, $4, $5)",
        now, submission.job_id, message.headers.get(KEY_ID_HEADER), submission.tenant_hint, reason)
    log.warning("rejected submission %s: %s", submission.job_id, reason)


async def take_rate_token(conn: asyncpg.Connection, tenant: str, limit: RateLimit, now: datetime) -> bool:
    row = await conn.fetchrow("SELECT tokens, updated_at FROM admission_rate_buckets WHERE tenant = $1 FOR UPDATE",
                              tenant)
    allowed, bucket = take(Bucket(row["tokens"], row["updated_at"]) if row else None, limit, now)
    await conn.execute(
        "INSERT INTO admission_rate_buckets (tenant, tokens, updated_at) VALUES ($1, $2, $3)"
        " ON CONFLICT (tenant) DO UPDATE SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at",
        tenant, bucket.tokens, bucket.updated_at)
    return allowed


async def is_repeat(conn: asyncpg.Connection, tenant: str, submission: Submission) -> bool:
    """True when this tenant's request id already created another job."""
    job_id = await conn.fetchval(
        "INSERT INTO submission_requests (tenant, request_id, job_id) VALUES ($1, $2, $3)"
        " ON CONFLICT (tenant, request_id) DO UPDATE SET request_id = EXCLUDED.request_id RETURNING job_id",
        tenant, submission.request_id, submission.job_id)
    return job_id != submission.job_id
