"""Admission's handler: parse, authenticate, dedupe, load, decide (``core.decide_submission``), append with
the outbox (the transaction and the offset commit around it belong to the batch consumer)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from gpusched_common.batching import Batch, TxHandler
from gpusched_common import producers
from gpusched_common.credentials import KEY_ID_HEADER, TenantKey, verify
from gpusched_common.identity import Verdict
from gpusched_common.jobs import append_job_events, defer_job_events, load_job
from gpusched_common import events as ev
from gpusched_common.messaging import Incoming, PoisonMessage, parse_event
from gpusched_common.store import claim
from gpusched_common.stores.gpu_models import ModelReader
from gpusched_common.stores.tenancy import TenancyReader

from gpusched_core import lifecycle
from gpusched_core.rates import Bucket
from gpusched_core.submission import with_default_time_limit, with_priority_class
from services.admission import store
from services.admission.core import (
    AdmissionLimits,
    RateLimit,
    Submission,
    Unparseable,
    decide_submission,
    parse_submission,
    unauthenticated,
)

SERVICE = "admission"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdmissionPolicy:
    limits: AdmissionLimits
    rate: RateLimit
    keys: dict[str, TenantKey] | None  # the tenant keys file's keys (None: no such file)
    # False only in development: a submission without any credential is then taken at its word; one that
    # carries a credential is verified all the same
    require_credentials: bool = True


def make_submission_handler(policy: AdmissionPolicy, clock: Callable[[], datetime],
                            tenancy: TenancyReader | None = None, models: ModelReader | None = None) -> TxHandler:
    tenancy = tenancy or TenancyReader()
    models = models or ModelReader()

    async def on_submitted(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        now = clock()
        in_force = await tenancy.current(conn, now)
        # the cluster's GPU models: a job's model must be one a registered node has (or one declared)
        view = await models.current(conn, now, in_force.flavors if in_force is not None else ())
        try:
            submission = parse_submission(message.value, policy.limits, view)
        except Unparseable as exc:
            raise PoisonMessage(str(exc)) from exc
        verdict = await authenticate(conn, policy, message, submission, batch.memo.setdefault("producers", {}))
        credential = message.headers.get(producers.PRODUCER_HEADER) or message.headers.get(KEY_ID_HEADER)
        if unauthenticated(verdict):  # counted; no stream, no inbox row: a forger cannot fill the store
            await store.count_auth_failure(conn, credential, verdict.reason or "", now)
            return
        if not await claim(conn, SERVICE, submission.event_id):
            return
        tenant = submission.spec.tenant if submission.spec else None
        # a tenant's rate bucket is locked and read once per batch, kept in the batch, and written at its end
        buckets: dict[str, Bucket | None] = batch.memo.setdefault("rate-buckets", {})  # type: ignore[assignment]
        bucket = None
        if tenant is not None and verdict.reason is None:
            if tenant not in buckets:
                buckets[tenant] = await store.lock_bucket(conn, tenant)
            bucket = buckets[tenant]
        decided = decide_submission(submission, verdict, bucket, policy.rate, in_force, now)
        if decided.auth_failure is not None:  # authenticated, but not for this tenant: rejected with the reason
            await store.count_auth_failure(conn, credential, decided.auth_failure, now)
        if decided.bucket is not None and tenant is not None:
            buckets[tenant] = decided.bucket

            async def save(c: asyncpg.Connection, tenant: str = tenant) -> None:
                saved = buckets[tenant]
                if saved is not None:
                    await store.save_bucket(c, tenant, saved)

            batch.after(f"rate-bucket:{tenant}", save)
        if decided.check_repeat and tenant is not None and await store.is_repeat(conn, tenant, submission):
            log.info("submission %s repeats request %s of tenant %s; no new job", submission.job_id,
                     submission.request_id, tenant)
            return
        admitted = None if decided.reasons or submission.spec is None else \
            with_priority_class(with_default_time_limit(submission.spec, in_force), in_force)
        command = lifecycle.RegisterSubmission(
            spec=admitted, submitted_at=now,  # admission's clock, never the client's
            rejection_reasons=submission.reasons + decided.reasons, tenant_hint=submission.tenant_hint,
            request_id=submission.request_id, submitted_by=verdict.subject if verdict.tenant else None,
            producer=verdict.producer, hold=submission.hold,
        )
        state = await load_job(conn, submission.job_id)
        # written with the batch's other decisions in one statement at its end (nothing later reads it back)
        defer_job_events(batch, state, lifecycle.decide(state, command, now), producer=SERVICE, now=now)

    return on_submitted


async def authenticate(conn: asyncpg.Connection, policy: AdmissionPolicy, message: Incoming,
                       submission: Submission, known: dict | None = None) -> Verdict:
    """Who sent the submission: a credentialed producer (``gpusched-producer``, checked against the store,
    so a revocation holds from the next batch on; ``known``: the batch's records read so far), else a key
    of the tenant keys file, else nobody (refused unless credentials are not required)."""
    if producers.PRODUCER_HEADER in message.headers:
        tenant = submission.spec.tenant if submission.spec else submission.tenant_hint
        return await producers.verify(conn, message.headers, message.value, tenant, submission.attested,
                                      known=known)
    if policy.keys is not None and KEY_ID_HEADER in message.headers:
        return verify(policy.keys, message.headers, message.value)
    if policy.require_credentials:
        return Verdict(None, MISSING_CREDENTIAL)
    return Verdict(None, None)


MISSING_CREDENTIAL = ("missing credential: a producer's gpusched-producer and gpusched-producer-signature headers "
                      "(or a tenant key's gpusched-key-id and gpusched-signature)")


def make_control_handler(clock: Callable[[], datetime]) -> TxHandler:
    """``gpusched.jobs.control``: a cancel the gateway authorized for its caller. Admission checks who sent
    it (only a producer that attests: the gateway), then the job's lifecycle decides (a job holding GPUs is
    asked to stop; any other ends Cancelled; a finished one is left as it is)."""

    async def on_control(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if isinstance(payload, ev.CordonNode):
            return  # an operator's node control: placement decides it
        if not isinstance(payload, ev.CancelJob | ev.HoldJob | ev.ReleaseJob):
            raise PoisonMessage(f"{envelope.type} is not a control request")
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        now = clock()
        state = await load_job(conn, payload.job_id)
        if state.status is None or state.spec is None:
            log.info("cancel of %s: no such job", payload.job_id)
            return
        tenant = state.spec.tenant
        verdict = await producers.verify(conn, message.headers, message.value, tenant, payload.requested_by,
                                         must_attest=True) if producers.PRODUCER_HEADER in message.headers else \
            Verdict(None, "missing credential: a control request must be signed by the gateway's producer")
        if verdict.reason is not None:
            await store.record_control_refusal(conn, payload.job_id, message.headers.get(producers.PRODUCER_HEADER),
                                               tenant, verdict.reason, now)
            return
        command = _CONTROL[type(payload)](payload)
        try:
            events = lifecycle.decide(state, command, now)
        except lifecycle.InvalidTransition as exc:  # e.g. a hold that raced the job's placement
            log.info("%s of %s: %s", envelope.type, payload.job_id, exc)
            return
        await append_job_events(conn, state, events, producer=SERVICE, now=now)

    return on_control


_CONTROL = {  # each control request and the lifecycle command it asks for
    ev.CancelJob: lambda p: lifecycle.Cancel(reason=p.reason, requested_by=p.requested_by),
    ev.HoldJob: lambda p: lifecycle.Hold(reason=p.reason, requested_by=p.requested_by),
    ev.ReleaseJob: lambda p: lifecycle.Release(requested_by=p.requested_by),
}
