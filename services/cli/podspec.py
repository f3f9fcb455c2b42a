"""Kubernetes pod specs as job submissions: `nvidia.com/gpu` limits, `nvidia.com/mig-<profile>` limits (the
GPU operator's mixed-strategy names), the GPU product node selector, and gpusched annotations for a gang
(`gpusched.io/gang-nodes`) or a share of a GPU (`gpusched.io/gpu-share-milli`, `gpusched.io/gpu-memory-mib`)."""

from __future__ import annotations

from typing import Any

import yaml

from gpusched_common import events as ev

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GANG_ANNOTATION = "gpusched.io/gang-nodes"
SHARE_ANNOTATION = "gpusched.io/gpu-share-milli"
SHARE_MEMORY_ANNOTATION = "gpusched.io/gpu-memory-mib"


class PodSpecError(ValueError):
    pass


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
    )


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
