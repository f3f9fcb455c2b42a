"""Admission decisions (pure): parse a raw submission and list every reason to reject it (the spec's own
checks are shared with the gateway: ``gpusched_core.submission``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from gpusched_common import events as ev
from gpusched_common.identity import OPERATOR, Verdict
from gpusched_common.ids import is_valid_id
from gpusched_core.quota import Tenancy
from gpusched_core.rates import Bucket, RateLimit, take
from gpusched_core.gpu_models import ModelView
from gpusched_core.submission import (
    AdmissionLimits,
    check_against_tenancy,
    check_job,
    check_spec,
    error_reasons,
    with_resolved_model,
)


@dataclass(frozen=True)
class Submission:
    """A submission that names a job: either a valid spec, or reasons why it is rejected."""

    event_id: str
    job_id: str
    submitted_at: datetime | None
    spec: ev.JobSpec | None
    reasons: tuple[str, ...]
    tenant_hint: str | None
    traceparent: str | None
    request_id: str | None = None
    attested: str | None = None  # the submitter the producer names (believed only from one that may attest)
    hold: bool = False  # submitted held


class Unparseable(ValueError):
    """Not even a job id can be read: the message is dead-lettered."""


def parse_submission(raw: bytes, limits: AdmissionLimits, models: ModelView | None = None) -> Submission:
    """The submission's spec, checked (``check_spec``: with ``models``, its GPU model must be one the
    cluster has) and with its GPU model as the cluster names it, or every reason it is refused."""
    if len(raw) > limits.max_submission_bytes:
        return _oversized(raw, limits)
    if b"\x00" in raw or b"\\u0000" in raw:
        raise Unparseable("submission holds a NUL character")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Unparseable(f"submission is not valid JSON: {exc}") from exc
    except RecursionError:
        raise Unparseable("submission is nested too deep") from None
    if not isinstance(doc, dict):
        raise Unparseable("submission is not a JSON object")
    payload = doc.get("payload") if isinstance(doc.get("payload"), dict) else {}
    job_id = payload.get("job_id")
    event_id = doc.get("event_id")
    if not isinstance(job_id, str) or not is_valid_id(job_id) or not isinstance(event_id, str):
        raise Unparseable("submission has no valid event_id and payload.job_id")
    spec_doc = payload.get("spec") if isinstance(payload.get("spec"), dict) else {}
    tenant_hint = spec_doc.get("tenant") if isinstance(spec_doc.get("tenant"), str) else None
    traceparent = doc.get("traceparent") if isinstance(doc.get("traceparent"), str) else None
    try:
        envelope = ev.Envelope.model_validate(doc)
        if envelope.type != ev.JobSubmitted.TYPE:
            raise ev.UnknownEventType(f"expected a JobSubmitted, got {envelope.type!r}")
        payload_model = ev.parse_payload(envelope)
    except (ValidationError, ev.UnknownEventType) as exc:
        return Submission(event_id, job_id, None, None, error_reasons(exc), tenant_hint, traceparent)
    assert isinstance(payload_model, ev.JobSubmitted)
    reasons = check_spec(payload_model.spec, limits, models) + check_job(job_id, payload_model.spec)
    spec = payload_model.spec
    if not reasons:
        spec = with_resolved_model(spec, models)
    return Submission(event_id, job_id, payload_model.submitted_at, None if reasons else spec, reasons,
                      tenant_hint, envelope.traceparent, payload_model.request_id, payload_model.submitted_by,
                      payload_model.hold)


def check_identity(spec_tenant: str | None, credential_tenant: str | None, auth_reason: str | None) -> tuple[str, ...]:
    """The tenant comes from the credential: a failed authentication, or a spec naming another tenant than
    the credential's, is a reason to reject. `*` (an operator key) may act for any tenant."""
    if auth_reason is not None:
        return (auth_reason,)
    if credential_tenant not in (None, OPERATOR) and spec_tenant is not None and spec_tenant != credential_tenant:
        return (f"tenant {spec_tenant!r} does not match the credential's tenant {credential_tenant!r}",)
    return ()


def _oversized(raw: bytes, limits: AdmissionLimits) -> Submission:
    # Too big to trust: read only enough to name the job, so the rejection is recorded against it.
    try:
        doc = json.loads(raw)
        job_id = doc["payload"]["job_id"]
        event_id = doc["event_id"]
        tenant = doc["payload"].get("spec", {}).get("tenant")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Unparseable(f"submission of {len(raw)} bytes exceeds {limits.max_submission_bytes} bytes") from exc
    if not isinstance(job_id, str) or not is_valid_id(job_id) or not isinstance(event_id, str):
        raise Unparseable(f"submission of {len(raw)} bytes exceeds {limits.max_submission_bytes} bytes")
    reason = f"submission is {len(raw)} bytes; the limit is {limits.max_submission_bytes} bytes"
    return Submission(event_id, job_id, None, None, (reason,), tenant if isinstance(tenant, str) else None, None)


@dataclass(frozen=True)
class Verdicts:
    """What admission decided for one submission: its rejection reasons (none: admit), the tenant's rate
    bucket after it (None: unchanged), the authentication failure to record, and whether to look the
    request id up (a repeat of an admitted request creates no second job)."""

    reasons: tuple[str, ...]
    bucket: Bucket | None = None
    auth_failure: str | None = None
    check_repeat: bool = False


def unauthenticated(verdict: Verdict) -> bool:
    """No known credential signed the message (missing, unknown, revoked, a signature that does not
    hold): it is counted, and creates no stream (a forger cannot fill the store)."""
    return verdict.tenant is None and verdict.reason is not None and not verdict.authenticated


def failure_key(reason: str, credential: str | None) -> tuple[str, str]:
    """The counter a failure is added to: (kind, credential). A missing or unknown credential is one kind
    whatever a forgery names; any other failure names a credential the store or the keys file knows."""
    if reason.startswith("missing"):
        return "missing credential", "-"
    if reason.startswith(("unknown producer", "unknown credential")):
        return "unknown credential", "-"
    return reason[:200], (credential or "-")[:64]


def decide_submission(submission: Submission, verdict: Verdict, bucket: Bucket | None, rate: RateLimit,
                      tenancy: Tenancy | None, now: datetime) -> Verdicts:
    """The checks in order, the first that fails deciding: who sent it (the credential's tenant must be
    the spec's), the tenant's submission rate (a token is taken only from an authenticated tenant), then
    the tenancy in force (None: none installed yet, quota alone decides). The parse's own reasons come
    with every rejection."""
    spec = submission.spec
    reasons = check_identity(spec.tenant if spec else submission.tenant_hint, verdict.tenant, verdict.reason)
    if reasons:
        return Verdicts(reasons, auth_failure=reasons[0])
    if spec is None:
        return Verdicts(())
    allowed, after = take(bucket, rate, now)
    if not allowed:
        return Verdicts((f"tenant {spec.tenant} exceeded its submission rate ({rate.per_s:g}/s, "
                         f"burst {rate.burst:g})",), after)
    reasons = check_against_tenancy(submission.job_id, spec, tenancy) if tenancy is not None else ()
    return Verdicts(reasons, after, check_repeat=not reasons and bool(spec.tenant and submission.request_id))
