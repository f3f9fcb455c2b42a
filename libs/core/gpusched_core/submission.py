"""What every door checks of a job spec (pure), with every reason at once: the cluster's limits
(``check_spec``: sizes, shapes, GPU models, MIG profiles, priority, command) and the tenancy in force
(``check_against_tenancy``). Given the cluster's models (``gpu_models.ModelView``), a GPU model is
accepted only when it resolves to one of them, and a share's memory is bounded by that model's inventory. Admission decides with them; the gateway answers a bad request with the same
reasons before anything is published."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import ValidationError

from gpusched_common import events as ev
from gpusched_common.ids import is_valid_id
from gpusched_common.resources import (
    MAX_COMMAND_BYTES,
    MAX_CPU_MILLI_PER_NODE,
    MAX_GANG_NODES,
    MAX_MEMORY_MIB_PER_NODE,
    MAX_GPUS_PER_JOB,
    MAX_PRIORITY,
    MAX_SUBMISSION_BYTES,
    MEMORY_CLASSES_GB,
    canonical_model,
    model_memory_class_mib,
)

from gpusched_core.arrays import check_task
from gpusched_core.dependencies import check_after
from gpusched_core.durations import format_duration
from gpusched_core.gpu_models import ModelView, Refusal
from gpusched_core.jobenv import check_command, check_env
from gpusched_core.placement.mig import MIG_FAMILIES, mig_family
from gpusched_core.quota import Tenancy
from gpusched_core.quota.jobs import priority_class_for, queued_job, to_pending
from gpusched_core.quota.reasons import not_allowed, unknown_tenant

MAX_TIME_LIMIT_S = 366 * 86400.0  # a year: beyond it a limit is no limit (a tenancy may set a lower maximum)

MAX_IMAGE_CHARS = 512
MAX_NODE_SELECTOR = 32
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"^(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+:[0-9]+|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+:[0-9]+)/)?"
    rf"{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*$")

# MIG profiles each MIG-capable model offers (the placement engine's geometry, NVIDIA's names)
MIG_PROFILES_BY_MODEL = {model: tuple(profiles) for model, profiles in MIG_FAMILIES.items()}
LARGEST_GPU_MIB = MEMORY_CLASSES_GB[-1] * 1024  # a share's memory bound where no GPU's is known


@dataclass(frozen=True)
class AdmissionLimits:
    max_gpus_per_job: int = MAX_GPUS_PER_JOB
    max_priority: int = MAX_PRIORITY
    max_submission_bytes: int = MAX_SUBMISSION_BYTES
    max_command_bytes: int = MAX_COMMAND_BYTES
    max_gang_nodes: int = MAX_GANG_NODES
    max_cpu_milli_per_node: int = MAX_CPU_MILLI_PER_NODE
    max_memory_mib_per_node: int = MAX_MEMORY_MIB_PER_NODE


def check_spec(spec: ev.JobSpec, limits: AdmissionLimits, models: ModelView | None = None) -> tuple[str, ...]:
    """Every reason the spec breaks a cluster limit, all at once (empty when admissible). With ``models``
    its GPU model must be one the cluster has (``resolve_model``); without, only a model name."""
    reasons = []
    if not is_valid_id(spec.tenant):
        reasons.append(f"tenant {spec.tenant!r} is not a valid name")
    if spec.gpus < 1:
        reasons.append(f"gpus must be at least 1, got {spec.gpus}")
    elif spec.gpus > limits.max_gpus_per_job:
        reasons.append(f"gpus {spec.gpus} exceeds the limit of {limits.max_gpus_per_job} GPUs per node")
    model = resolve_model(spec.gpu_model, models)
    if isinstance(model, Refusal):
        reasons.append(model.reason)
    reasons.extend(check_shape(spec, limits, models, None if isinstance(model, Refusal) else model))
    if not 0 <= spec.cpu_milli <= limits.max_cpu_milli_per_node:
        reasons.append(f"cpu_milli {spec.cpu_milli} is outside 0..{limits.max_cpu_milli_per_node} (per node)")
    if not 0 <= spec.memory_mib <= limits.max_memory_mib_per_node:
        reasons.append(f"memory_mib {spec.memory_mib} is outside 0..{limits.max_memory_mib_per_node} (per node)")
    if not 0 <= spec.priority <= limits.max_priority:
        reasons.append(f"priority {spec.priority} is outside 0..{limits.max_priority}")
    if spec.time_limit_s is not None and not 0 < spec.time_limit_s <= MAX_TIME_LIMIT_S:
        reasons.append(f"time_limit_s {spec.time_limit_s:g} is outside (0, {MAX_TIME_LIMIT_S:g}] seconds")
    reasons.extend(check_env(spec.env) + check_command([*spec.command, *spec.args]) + check_runtime(spec))
    if not all(spec.command) or (not spec.command and spec.image is None):
        reasons.append("command is empty: a job without an image needs one" if not spec.command else
                       "command has an empty part")
    elif sum(len(part.encode()) for part in [*spec.command, *spec.args]) > limits.max_command_bytes:
        reasons.append(f"command is longer than {limits.max_command_bytes} bytes")
    return tuple(reasons)


def check_runtime(spec: ev.JobSpec) -> list[str]:
    """The image reference, the node selector and the priority class name: each well formed and bounded."""
    reasons = []
    if spec.args and (spec.image is None or spec.command):
        reasons.append("args are the arguments of an image's entrypoint: with a command, put them in the command"
                       if spec.command else "args are the arguments of an image's entrypoint: give an image")
    if spec.image is not None and not is_image_reference(spec.image):
        reasons.append(f"image {spec.image[:80]!r} is not an image reference such as registry.example/team/train:1.2 "
                       f"(at most {MAX_IMAGE_CHARS} characters)")
    if len(spec.node_selector) > MAX_NODE_SELECTOR:
        reasons.append(f"node_selector has {len(spec.node_selector)} labels; at most {MAX_NODE_SELECTOR}")
    for key, value in list(spec.node_selector.items())[:MAX_NODE_SELECTOR + 1]:
        if not is_label_key(key):
            reasons.append(f"node_selector key {key[:80]!r} is not a label name (prefix/name, name at most 63 characters)")
        if not is_label_value(value):
            reasons.append(f"node_selector value {value[:80]!r} of {key[:80]!r} is not a label value (at most 63 "
                           "characters: letters, digits, '-', '_', '.', starting and ending with a letter or digit)")
    if spec.priority_class is not None and not is_valid_id(spec.priority_class):
        reasons.append(f"priority_class {spec.priority_class[:80]!r} is not a valid name")
    return reasons


def is_image_reference(text: str) -> bool:
    return len(text) <= MAX_IMAGE_CHARS and _IMAGE.match(text) is not None


def is_label_key(text: str) -> bool:
    prefix, _, name = text.rpartition("/")
    return (_LABEL_NAME.match(name) is not None and len(name) <= 63
            and (not prefix or (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix) is not None)))


def is_label_value(text: str) -> bool:
    return text == "" or (len(text) <= 63 and _LABEL_NAME.match(text) is not None)


def check_job(job_id: str, spec: ev.JobSpec) -> tuple[str, ...]:
    """Every reason the spec does not fit the job it is submitted as: an array task's id and description,
    and its dependencies (how many, valid ids, not itself)."""
    reasons = check_task(job_id, spec.array) if spec.array is not None else []
    return tuple(reasons + check_after(job_id, spec.after))


def resolve_model(requested: str | None, models: ModelView | None) -> str | Refusal | None:
    """The model a spec's ``gpu_model`` means: the cluster's spelling of it (``ModelView.resolve``), or by
    rule alone without a view (``canonical_model``); None: any model."""
    if requested is None:
        return None
    if models is not None:
        return models.resolve(requested)
    return canonical_model(requested) or Refusal(f"unknown GPU model {requested!r}")


def with_resolved_model(spec: ev.JobSpec, models: ModelView | None) -> ev.JobSpec:
    """The spec with its GPU model as the cluster spells it (what placement matches and the tenancy's
    flavors name); as it is when it names none or one that does not resolve (``check_spec`` says why)."""
    model = resolve_model(spec.gpu_model, models)
    return spec.model_copy(update={"gpu_model": model}) if isinstance(model, str) and model != spec.gpu_model else spec


def check_shape(spec: ev.JobSpec, limits: AdmissionLimits, models: ModelView | None = None,
                model: str | None = None) -> list[str]:
    """Gangs, shares and MIG slices: each within its limits, and at most one of them per job (``model``:
    the spec's GPU model resolved, None: any or unknown; a share's memory within that model's)."""
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
        limit = (models.memory_mib(model) if models is not None else model_memory_class_mib(model or "")) \
            or LARGEST_GPU_MIB
        if not 0 <= share.memory_mib <= limit:
            reasons.append(f"gpu_share.memory_mib {share.memory_mib} is outside 0..{limit}")
    if spec.mig_profile is not None:
        reasons.extend(check_mig(spec.mig_profile, model, models))
    return reasons


def check_mig(profile: str, model: str | None, models: ModelView | None) -> list[str]:
    """A MIG profile exists on the model (one NVIDIA's geometry for which is known), or on any MIG model."""
    if model is None:
        if any(profile in profiles for profiles in MIG_PROFILES_BY_MODEL.values()):
            return []
        known = sorted({p for profiles in MIG_PROFILES_BY_MODEL.values() for p in profiles})
        return [f"MIG profile {profile!r} does not exist on any MIG-capable GPU model (known: {', '.join(known)})"]
    memory = models.memory_mib(model) if models is not None else None
    if models is None and model_memory_class_mib(model) is None:
        return []  # a name without a memory class: admission resolves it against the cluster
    family = mig_family(model, memory)
    if family is None:
        return [f"MIG profile {profile!r} does not exist on a {model}: MIG is placed only on models whose MIG "
                f"geometry is known ({', '.join(MIG_PROFILES_BY_MODEL)})"]
    if profile not in MIG_PROFILES_BY_MODEL[family]:
        return [f"MIG profile {profile!r} does not exist on a {model} (known: "
                f"{', '.join(sorted(MIG_PROFILES_BY_MODEL[family]))})"]
    return []


def error_reasons(exc: Exception) -> tuple[str, ...]:
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



def check_against_tenancy(job_id: str, spec: ev.JobSpec, tenancy: Tenancy) -> tuple[str, ...]:
    """Every reason the tenancy refuses the job: unknown tenant, a priority class the tenant may not use,
    a GPU model with no quota anywhere, a request that cannot be charged (e.g. an unknown MIG shape)."""
    charged = tenancy.charged_tenant(spec.tenant)
    tenant = tenancy.tenants.get(charged)
    if tenant is None or not tenant.is_leaf:
        return (unknown_tenant(spec.tenant),)
    reasons = []
    limits = tenant.time_limits
    if spec.time_limit_s is not None and limits.max_s is not None and spec.time_limit_s > limits.max_s:
        reasons.append(f"time limit {format_duration(spec.time_limit_s)} exceeds tenant {spec.tenant}'s maximum of "
                       f"{format_duration(limits.max_s)}")
    if spec.priority_class is not None and spec.priority_class not in tenancy.priority_classes:
        reasons.append(f"priority class {spec.priority_class!r} does not exist "
                       f"(the tenancy has: {', '.join(sorted(tenancy.priority_classes))})")
        return tuple(reasons)
    priority_class = spec.priority_class or priority_class_for(tenancy, spec.priority)
    if priority_class not in tenant.priority_classes:
        reasons.append(not_allowed(spec.tenant, priority_class, tenant.priority_classes))
    if spec.gpu_model is not None and spec.gpu_model not in tenancy.flavors:
        reasons.append(f"GPU model {spec.gpu_model} has no quota in the tenancy (flavors: {', '.join(tenancy.flavors)})")
    else:
        pending = to_pending(tenancy, queued_job(job_id, spec, 0.0))
        if isinstance(pending, str):
            reasons.append(pending)
    return tuple(reasons)


def with_priority_class(spec: ev.JobSpec, tenancy: Tenancy | None) -> ev.JobSpec:
    """The spec with its priority as its class's value (a value no class has, or 0, is the default class):
    every service then ranks and charges the same class (None: no tenancy in force, as it is)."""
    if tenancy is None:
        return spec
    value = tenancy.priority_classes.get(spec.priority_class or priority_class_for(tenancy, spec.priority))
    return spec if value is None or value == spec.priority else spec.model_copy(update={"priority": value})


def with_default_time_limit(spec: ev.JobSpec, tenancy: Tenancy | None) -> ev.JobSpec:
    """The spec with its tenant's default time limit where it names none (the tenancy's; none: as it is)."""
    if spec.time_limit_s is not None or tenancy is None:
        return spec
    tenant = tenancy.tenants.get(tenancy.charged_tenant(spec.tenant))
    default = tenant.time_limits.default_s if tenant is not None else None
    return spec if default is None else spec.model_copy(update={"time_limit_s": default})
