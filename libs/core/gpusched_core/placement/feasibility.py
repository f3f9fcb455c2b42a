"""Which nodes can host a request, and for the others, the first check each one failed.

Checks run in a fixed order (node selector, GPU model, GPU health / MIG mode, CPU, memory, GPU
capacity), vectorised over all nodes. ``explain`` groups the failing nodes by their first failed
check, which is what "why is my job pending" shows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .mig import MIG_FAMILIES
from .model import CONTAINERS_LABEL, MILLI_PER_GPU, GpuShare, MigSlice, NodeClassReason, PodRequest, WholeGpus
from .snapshot import MIG_FAMILY_NAMES, ClusterSnapshot

Check = tuple[np.ndarray, str]


def gpu_free_for(snapshot: ClusterSnapshot, request: PodRequest) -> np.ndarray:
    """(nodes, gpus) milli free on GPUs this request may use for whole or shared GPUs."""
    if not request.allowed_models:
        return snapshot.share_free
    return np.where(snapshot.layout.model_mask(request.allowed_models), snapshot.share_free, 0)


def _models_text(request: PodRequest) -> str:
    return "|".join(sorted(request.allowed_models))


def mig_gpu_mask(snapshot: ClusterSnapshot, request: PodRequest, profile: str) -> np.ndarray:
    """(nodes, gpus) GPUs of an allowed model whose MIG family has ``profile``."""
    families = [i for i, name in enumerate(MIG_FAMILY_NAMES) if profile in MIG_FAMILIES[name]]
    layout = snapshot.layout
    return np.isin(layout.mig_family, families) & layout.model_mask(request.allowed_models)


def mig_start_free(snapshot: ClusterSnapshot, profile: str) -> np.ndarray:
    """(nodes, gpus, starts) which start slices of ``profile`` are free, per GPU of its family.

    Every family shares the same geometry per profile size, so the table of the first family
    that has the profile gives the starts.
    """
    spec = next(f[profile] for f in MIG_FAMILIES.values() if profile in f)
    masks = np.array([spec.mask_at(start) for start in spec.starts], dtype=np.uint8)
    return (snapshot.mig_used[:, :, None] & masks[None, None, :]) == 0


def _gpu_checks(snapshot: ClusterSnapshot, request: PodRequest) -> Iterator[Check]:
    gpu, layout = request.gpu, snapshot.layout
    if isinstance(gpu, MigSlice):
        family_ok = mig_gpu_mask(snapshot, request, gpu.profile)
        yield family_ok.any(axis=1), f"no GPU of a model with MIG profile {gpu.profile}"
        enabled = family_ok & snapshot.gpu_mig_mode & snapshot.gpu_healthy
        yield enabled.any(axis=1), f"no healthy MIG-enabled GPU for {gpu.profile}"
        return
    allowed = layout.model_mask(request.allowed_models)
    if request.allowed_models:
        yield allowed.any(axis=1), f"no GPU of an allowed model ({_models_text(request)})"
    else:
        yield layout.gpu_count > 0, "no GPUs"
    usable = allowed & snapshot.gpu_healthy & ~snapshot.gpu_mig_mode
    yield usable.any(axis=1), "no healthy GPU outside MIG mode"


def _capacity_check(snapshot: ClusterSnapshot, request: PodRequest) -> Check | None:
    gpu = request.gpu
    if isinstance(gpu, WholeGpus):
        if request.allowed_models:
            count = (gpu_free_for(snapshot, request) == MILLI_PER_GPU).sum(axis=1)
        else:
            count = snapshot.full_free_count
        noun = "GPU" if gpu.count == 1 else "GPUs"
        return count >= gpu.count, f"fewer than {gpu.count} fully free {noun}"
    if isinstance(gpu, GpuShare):
        text = f"no GPU with {gpu.milli} milli free"
        if gpu.memory_mib == 0 and not request.allowed_models:
            return snapshot.max_share_free >= gpu.milli, text
        fits = gpu_free_for(snapshot, request) >= gpu.milli
        if gpu.memory_mib:
            fits &= snapshot.gpu_memory_free >= gpu.memory_mib
            text += f" and {gpu.memory_mib} MiB GPU memory free"
        return fits.any(axis=1), text
    if isinstance(gpu, MigSlice):
        usable = mig_gpu_mask(snapshot, request, gpu.profile) & snapshot.gpu_mig_mode
        usable &= snapshot.gpu_healthy
        free = mig_start_free(snapshot, gpu.profile).any(axis=2) & usable
        return free.any(axis=1), f"no free MIG position for {gpu.profile}"
    return None


def _selector_reason(selector: tuple[tuple[str, str], ...]) -> str:
    """Why a node fails a selector; the container runtime label (an image job's) said in words."""
    pairs = [(k, v) for k, v in selector if (k, v) != (CONTAINERS_LABEL, "true")]
    parts = [f"node selector {','.join(f'{k}={v}' for k, v in pairs)} does not match"] if pairs else []
    if len(pairs) < len(selector):
        parts.append("no container runtime (the job has an image)")
    return " or ".join(parts)


def _checks(snapshot: ClusterSnapshot, request: PodRequest, *, implied: bool = True) -> Iterator[Check]:
    """The checks in order; ``implied=False`` skips the GPU model/health checks, which the capacity
    check repeats (free capacity is 0 on GPUs of other models, unhealthy or in the wrong mode)."""
    if request.node_selector:
        yield snapshot.layout.selector_mask(request.node_selector), _selector_reason(request.node_selector)
    if request.gpu is not None and implied:
        yield from _gpu_checks(snapshot, request)
    if request.cpu_milli:
        yield snapshot.cpu_free >= request.cpu_milli, f"less than {request.cpu_milli} CPU milli free"
    if request.memory_mib:
        yield snapshot.memory_free >= request.memory_mib, f"less than {request.memory_mib} MiB memory free"
    capacity = _capacity_check(snapshot, request)
    if capacity is not None:
        yield capacity


def feasible_mask(snapshot: ClusterSnapshot, request: PodRequest) -> np.ndarray:
    """(nodes,) nodes that pass every check for ``request``."""
    mask = np.ones(snapshot.layout.node_count, dtype=bool)
    for check, _reason in _checks(snapshot, request, implied=False):
        mask &= check
    return mask


def explain(
    snapshot: ClusterSnapshot, request: PodRequest, excluded: np.ndarray | None = None
) -> tuple[NodeClassReason, ...]:
    """Failing nodes grouped by the first check they fail, in check order."""
    remaining = np.ones(snapshot.layout.node_count, dtype=bool)
    reasons: list[NodeClassReason] = []
    if excluded is not None and excluded.any():
        reasons.append(NodeClassReason("already used by this gang", int(excluded.sum())))
        remaining &= ~excluded
    for check, reason in _checks(snapshot, request):
        failed = int((remaining & ~check).sum())
        if failed:
            reasons.append(NodeClassReason(reason, failed))
        remaining &= check
    return tuple(reasons)
