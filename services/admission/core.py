"""Admission decisions (pure): parse a raw submission and list every reason to reject it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from gpusched_common import events as ev
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
    if credential_tenant not in (None, "*") and spec_tenant is not None and spec_tenant != credential_tenant:
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
