"""Admission decisions (pure): parse a raw submission and list every reason to reject it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from gpusched_common import events as ev
from gpusched_common.identity import OPERATOR, Verdict
from gpusched_common.ids import is_valid_id
from gpusched_common.resources import (
    GPU_MODELS,
    MAX_COMMAND_BYTES,
    MAX_CPU_MILLI_PER_NODE,
    MAX_GANG_NODES,
    MAX_MEMORY_MIB_PER_NODE,
    MAX_GPUS_PER_JOB,
    MAX_PRIORITY,
    MAX_SUBMISSION_BYTES,
    canonical_model,
    model_memory_mib,
)

from gpusched_core.placement.mig import MIG_FAMILIES
from gpusched_core.quota import Tenancy
from gpusched_core.quota.jobs import priority_class_for, queued_job, to_pending
from gpusched_core.quota.reasons import not_allowed, unknown_tenant

# MIG profiles each MIG-capable model offers (the placement engine's geometry, NVIDIA's names)
MIG_PROFILES_BY_MODEL = {model: tuple(profiles) for model, profiles in MIG_FAMILIES.items()}


@dataclass(frozen=True)
class AdmissionLimits:
    max_gpus_per_job: int = MAX_GPUS_PER_JOB
    max_priority: int = MAX_PRIORITY
    max_submission_bytes: int = MAX_SUBMISSION_BYTES
    max_command_bytes: int = MAX_COMMAND_BYTES
    max_gang_nodes: int = MAX_GANG_NODES
    max_cpu_milli_per_node: int = MAX_CPU_MILLI_PER_NODE
    max_memory_mib_per_node: int = MAX_MEMORY_MIB_PER_NODE


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


class Unparseable(ValueError):
    """Not even a job id can be read: the message is dead-lettered."""


def parse_submission(raw: bytes, limits: AdmissionLimits) -> Submission:
    if len(raw) > limits.max_submission_bytes:
        return _oversized(raw, limits)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Unparseable(f"submission is not valid JSON: {exc}") from exc
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
        return Submission(event_id, job_id, None, None, _error_reasons(exc), tenant_hint, traceparent)
    assert isinstance(payload_model, ev.JobSubmitted)
    reasons = check_spec(payload_model.spec, limits)
    spec = payload_model.spec
    if not reasons and spec.gpu_model is not None:
        spec = spec.model_copy(update={"gpu_model": canonical_model(spec.gpu_model)})
    return Submission(event_id, job_id, payload_model.submitted_at, None if reasons else spec, reasons,
                      tenant_hint, envelope.traceparent, payload_model.request_id)


def check_identity(spec_tenant: str | None, credential_tenant: str | None, auth_reason: str | None) -> tuple[str, ...]:
    """The tenant comes from the credential: a failed authentication, or a spec naming another tenant than
    the credential's, is a reason to reject. `*` (an operator key) may act for any tenant."""
    if auth_reason is not None:
        return (auth_reason,)
    if credential_tenant not in (None, OPERATOR) and spec_tenant is not None and spec_tenant != credential_tenant:
        return (f"tenant {spec_tenant!r} does not match the credential's tenant {credential_tenant!r}",)
    return ()


def check_spec(spec: ev.JobSpec, limits: AdmissionLimits) -> tuple[str, ...]:
    """Every reason the spec breaks a cluster limit, all at once (empty when admissible)."""
    reasons = []
    if not is_valid_id(spec.tenant):
        reasons.append(f"tenant {spec.tenant!r} is not a valid name")
    if spec.gpus < 1:
        reasons.append(f"gpus must be at least 1, got {spec.gpus}")
    elif spec.gpus > limits.max_gpus_per_job:
        reasons.append(f"gpus {spec.gpus} exceeds the limit of {limits.max_gpus_per_job} GPUs per node")
    if spec.gpu_model is not None and canonical_model(spec.gpu_model) is None:
        reasons.append(f"unknown GPU model {spec.gpu_model!r}")
    reasons.extend(check_shape(spec, limits))
    if not 0 <= spec.cpu_milli <= limits.max_cpu_milli_per_node:
        reasons.append(f"cpu_milli {spec.cpu_milli} is outside 0..{limits.max_cpu_milli_per_node} (per node)")
    if not 0 <= spec.memory_mib <= limits.max_memory_mib_per_node:
        reasons.append(f"memory_mib {spec.memory_mib} is outside 0..{limits.max_memory_mib_per_node} (per node)")
    if not 0 <= spec.priority <= limits.max_priority:
        reasons.append(f"priority {spec.priority} is outside 0..{limits.max_priority}")
    if not spec.command or not all(spec.command):
        reasons.append("command is empty")
    elif sum(len(part.encode()) for part in spec.command) > limits.max_command_bytes:
        reasons.append(f"command is longer than {limits.max_command_bytes} bytes")
    return tuple(reasons)


def check_shape(spec: ev.JobSpec, limits: AdmissionLimits) -> list[str]:
    """Gangs, shares and MIG slices: each within its limits, and at most one of them per job."""
    reasons = []
    if not 1 <= spec.nodes <= limits.max_gang_nodes:
        reasons.append(f"nodes {spec.nodes} is outside 1..{limits.max_gang_nodes} (nodes per gang)")
    fractional = [name for name, value in (("gpu_share", spec.gpu_share), ("mig_profile", spec.mig_profile))
                  if value is not None]
    if len(fractional) > 1:
        reasons.append("a job asks for a gpu_share or a mig_profile, not both")
    if fractional and (spec.gpus != 1 or spec.nodes != 1):
        reasons.append(f"a {fractional[0]} is part of one GPU on one node: gpus and nodes must be 1")
    share = spec.gpu_share
    if share is not None:
        if not 0 < share.milli < 1000:
            reasons.append(f"gpu_share.milli {share.milli} is outside 1..999 (use gpus for whole GPUs)")
        largest = max(m.memory_mib for m in GPU_MODELS)
        limit = model_memory_mib(spec.gpu_model) if spec.gpu_model and canonical_model(spec.gpu_model) else largest
        if not 0 <= share.memory_mib <= limit:
            reasons.append(f"gpu_share.memory_mib {share.memory_mib} is outside 0..{limit}")
    if spec.mig_profile is not None:
        models = [canonical_model(spec.gpu_model)] if spec.gpu_model and canonical_model(spec.gpu_model) else \
            list(MIG_PROFILES_BY_MODEL)
        if not any(spec.mig_profile in MIG_PROFILES_BY_MODEL.get(m or "", ()) for m in models):
            where = f"a {spec.gpu_model}" if spec.gpu_model else "any MIG-capable GPU model"
            known = sorted({p for m in models for p in MIG_PROFILES_BY_MODEL.get(m or "", ())})
            reasons.append(f"MIG profile {spec.mig_profile!r} does not exist on {where}"
                           + (f" (known: {', '.join(known)})" if known else ""))
    return reasons


def _error_reasons(exc: Exception) -> tuple[str, ...]:
    if not isinstance(exc, ValidationError):
        return (str(exc),)
    reasons = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "submission"
        if error["type"] == "extra_forbidden":
            reasons.append(f"unknown field {where!r}")
        else:
            reasons.append(f"{where}: {error['msg']}")
    return tuple(reasons)


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


def check_against_tenancy(job_id: str, spec: ev.JobSpec, tenancy: Tenancy) -> tuple[str, ...]:
    """Every reason the tenancy refuses the job: unknown tenant, a priority class the tenant may not use,
    a GPU model with no quota anywhere, a request that cannot be charged (e.g. an unknown MIG shape)."""
    charged = tenancy.charged_tenant(spec.tenant)
    tenant = tenancy.tenants.get(charged)
    if tenant is None or not tenant.is_leaf:
        return (unknown_tenant(spec.tenant),)
    reasons = []
    priority_class = priority_class_for(tenancy, spec.priority)
    if priority_class not in tenant.priority_classes:
        reasons.append(not_allowed(spec.tenant, priority_class, tenant.priority_classes))
    if spec.gpu_model is not None and spec.gpu_model not in tenancy.flavors:
        reasons.append(f"GPU model {spec.gpu_model} has no quota in the tenancy (flavors: {', '.join(tenancy.flavors)})")
    else:
        pending = to_pending(tenancy, queued_job(job_id, spec, 0.0))
        if isinstance(pending, str):
            reasons.append(pending)
    return tuple(reasons)


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_at: datetime


@dataclass(frozen=True)
class RateLimit:
    per_s: float
    burst: float


def take(bucket: Bucket | None, limit: RateLimit, now: datetime) -> tuple[bool, Bucket]:
    """Refill for the time passed (never beyond the burst), then take one token if there is one."""
    if bucket is None:
        tokens = limit.burst
    else:
        elapsed = max(0.0, (now - bucket.updated_at).total_seconds())
        tokens = min(limit.burst, bucket.tokens + elapsed * limit.per_s)
    if tokens >= 1.0:
        return True, Bucket(tokens - 1.0, now)
    return False, Bucket(tokens, now)


@dataclass(frozen=True)
class Verdicts:
    """What admission decided for one submission: its rejection reasons (none: admit), the tenant's rate
    bucket after it (None: unchanged), the authentication failure to record, and whether to look the
    request id up (a repeat of an admitted request creates no second job)."""

    reasons: tuple[str, ...]
    bucket: Bucket | None = None
    auth_failure: str | None = None
    check_repeat: bool = False


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
