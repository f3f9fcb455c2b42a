"""Kubernetes pod specs as job submissions: `nvidia.com/gpu` limits, `nvidia.com/mig-<profile>` limits (the
GPU operator's mixed-strategy names), the GPU product node selector, and gpusched annotations for a gang
(`gpusched.io/gang-nodes`), a share of a GPU (`gpusched.io/gpu-share-milli`, `gpusched.io/gpu-memory-mib`), a job
array (`gpusched.io/array: "0-99%8"`) and dependencies (`gpusched.io/after: "j-1:ok,j-2:any"`).
Host `cpu` and `memory` requests (limits when a container has no request) are summed over the containers,
as Kubernetes schedules a pod; for a gang they are per node."""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from gpusched_common import events as ev

from gpusched_core.dependencies import parse_after

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GANG_ANNOTATION = "gpusched.io/gang-nodes"
SHARE_ANNOTATION = "gpusched.io/gpu-share-milli"
SHARE_MEMORY_ANNOTATION = "gpusched.io/gpu-memory-mib"
ARRAY_ANNOTATION = "gpusched.io/array"  # a job array: "0-99%8"
AFTER_ANNOTATION = "gpusched.io/after"  # dependencies: "j-1:ok,j-2:any"


class PodSpecError(ValueError):
    pass


_MEMORY_SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
                    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)([a-zA-Z]*)$")


def cpu_milli(quantity: object) -> int:
    """A Kubernetes CPU quantity (``2``, ``1.5``, ``500m``) in milli-cores, rounded up."""
    match = _QUANTITY.match(str(quantity).strip())
    if match is None or match.group(2) not in ("", "m"):
        raise PodSpecError(f"cpu must be a quantity such as 2, 1.5 or 500m, got {quantity!r}")
    value = float(match.group(1))
    return math.ceil(value if match.group(2) == "m" else value * 1000)


def memory_mib(quantity: object) -> int:
    """A Kubernetes memory quantity (``64Gi``, ``512Mi``, ``1G``, bytes) in MiB, rounded up."""
    match = _QUANTITY.match(str(quantity).strip())
    if match is None or match.group(2) not in _MEMORY_SUFFIXES:
        raise PodSpecError(f"memory must be a quantity such as 64Gi, 512Mi or 1G, got {quantity!r}")
    return math.ceil(float(match.group(1)) * _MEMORY_SUFFIXES[match.group(2)] / 2**20)


def spec_from_pod_yaml(text: str, *, tenant: str | None = None, priority: int | None = None) -> ev.JobSpec:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PodSpecError(f"not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise PodSpecError("a pod spec must be a YAML mapping")
    metadata = doc.get("metadata") or {}
    pod = doc.get("spec") if doc.get("kind") == "Pod" or "spec" in doc else doc
    if not isinstance(pod, dict):
        raise PodSpecError("missing pod 'spec'")
    containers = pod.get("containers") or []
    if not containers:
        raise PodSpecError("the pod has no containers")
    gpus = sum(_gpu_limit(c) for c in containers)
    migs = sorted({name for c in containers for name in _limits(c) if name.startswith(MIG_RESOURCE_PREFIX)})
    if len(migs) > 1 or (migs and gpus):
        raise PodSpecError(f"a job asks for one MIG slice or whole GPUs, got {', '.join([*migs, GPU_RESOURCE][:3])}")
    annotations = metadata.get("annotations") or {}
    share = None
    if SHARE_ANNOTATION in annotations:
        share = ev.GpuShareSpec(milli=_int(annotations, SHARE_ANNOTATION),
                                memory_mib=_int(annotations, SHARE_MEMORY_ANNOTATION, 0))
    nodes = _int(annotations, GANG_ANNOTATION, 1)
    main = containers[0]
    command = [str(part) for part in (main.get("command") or []) + (main.get("args") or [])]
    if not command:
        raise PodSpecError("the first container has no command")
    env = {str(e["name"]): str(e.get("value", "")) for e in main.get("env") or [] if isinstance(e, dict) and "name" in e}
    tenant = tenant or metadata.get("namespace")
    if not tenant:
        raise PodSpecError("no tenant: pass --tenant or set metadata.namespace")
    selector = pod.get("nodeSelector") or {}
    return ev.JobSpec(
        tenant=str(tenant), gpus=max(gpus, 1) if (migs or share) else gpus, gpu_model=selector.get(PRODUCT_LABEL),
        priority=priority if priority is not None else int(pod.get("priority") or 0),
        command=command, name=metadata.get("name"), env=env, nodes=nodes, gpu_share=share,
        mig_profile=migs[0][len(MIG_RESOURCE_PREFIX):] if migs else None,
        cpu_milli=sum(cpu_milli(q) for q in _host(containers, "cpu")),
        memory_mib=sum(memory_mib(q) for q in _host(containers, "memory")),
        time_limit_s=_deadline(pod), after=_after(annotations),
    )


def pod_array(text: str) -> str | None:
    """The ``gpusched.io/array`` annotation of a pod spec (``0-99%8``), None without one (the gateway
    expands it; a pod spec it cannot read is refused by ``spec_from_pod_yaml`` with the reason)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    metadata = doc.get("metadata") if isinstance(doc, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    value = annotations.get(ARRAY_ANNOTATION) if isinstance(annotations, dict) else None
    return None if value is None else str(value)


def _after(annotations: dict[str, Any]) -> list[ev.Dependency]:
    """``gpusched.io/after: "j-1:ok,j-2:any"``: the jobs to wait for."""
    value = annotations.get(AFTER_ANNOTATION)
    if value is None:
        return []
    try:
        return [parse_after(part) for part in str(value).split(",") if part.strip()]
    except ValueError as exc:
        raise PodSpecError(f"annotation {AFTER_ANNOTATION}: {exc}") from None


def _host(containers: list[dict[str, Any]], name: str) -> list[Any]:
    """Each container's request of ``name`` (its limit when it has no request)."""
    out = []
    for container in containers:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(name, (resources.get("limits") or {}).get(name))
        if value is not None:
            out.append(value)
    return out


def _limits(container: dict[str, Any]) -> dict[str, Any]:
    resources = container.get("resources") or {}
    return {**(resources.get("requests") or {}), **(resources.get("limits") or {})}


def _int(annotations: dict[str, Any], key: str, default: int | None = None) -> int:
    value = annotations.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise PodSpecError(f"annotation {key} must be an integer, got {value!r}") from exc


def _gpu_limit(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(GPU_RESOURCE, (resources.get("requests") or {}).get(GPU_RESOURCE, 0))
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise PodSpecError(f"{GPU_RESOURCE} must be an integer, got {value!r}") from exc


def _deadline(pod: dict[str, Any]) -> float | None:
    """``activeDeadlineSeconds``: how long the pod may run, the job's time limit."""
    value = pod.get("activeDeadlineSeconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PodSpecError(f"activeDeadlineSeconds must be a number of seconds, got {value!r}")
    return float(value)
