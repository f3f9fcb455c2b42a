"""Which GPUs (or MIG slices) of the chosen node a request gets.

- Shared request: the policy's GPU when it named one, else best fit (least milli left that fits,
  then lowest index).
- Whole GPUs: fully free GPUs in as few NVLink/NVSwitch domains as possible; when one domain fits,
  the tightest such domain (keeps larger domains whole for larger jobs), then lowest indices.
- MIG slice: the GPU with the fewest free slices that can host the profile, at the start that keeps
  the largest profile placeable afterwards (then lowest GPU, lowest start).
"""

from __future__ import annotations

import numpy as np

from .mig import MIG_MEMORY_SLICES, free_slices, free_starts, largest_placeable, mig_profile
from .model import MILLI_PER_GPU, Binding, GpuShare, MigPlacement, MigSlice, PodRequest, WholeGpus
from .snapshot import MIG_FAMILY_NAMES, ClusterSnapshot


def _share_gpu(snapshot: ClusterSnapshot, request: PodRequest, row: int, free: np.ndarray) -> int:
    gpu = request.gpu
    assert isinstance(gpu, GpuShare)
    fits = free >= gpu.milli
    if gpu.memory_mib:
        fits &= snapshot.gpu_memory_free[row] >= gpu.memory_mib
    slack = np.where(fits, free, MILLI_PER_GPU + 1)
    return int(np.argmin(slack))


def select_whole_gpus(free: np.ndarray, domains: np.ndarray, count: int) -> tuple[int, ...]:
    """``count`` fully free GPU indices, in as few NVLink domains as possible (-1 = no NVLink). A node's
    handful of GPUs: plain Python over their lists (every whole-GPU decision binds here)."""
    groups: dict[int, list[int]] = {}
    found = 0
    for index, (milli, domain) in enumerate(zip(free.tolist(), domains.tolist())):
        if milli == MILLI_PER_GPU:
            key = domain if domain >= 0 else -1 - index  # a GPU without NVLink is a domain of its own
            groups.setdefault(key, []).append(index)
            found += 1
    if found < count:
        raise ValueError("not enough fully free GPUs")
    fitting = [g for g in groups.values() if len(g) >= count]
    if fitting:
        tightest = min(fitting, key=lambda g: (len(g), g[0]))
        return tuple(tightest[:count])
    chosen: list[int] = []
    for group in sorted(groups.values(), key=lambda g: (-len(g), g[0])):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))


def _mig_choice(snapshot: ClusterSnapshot, request: PodRequest, row: int) -> tuple[int, int]:
    gpu = request.gpu
    assert isinstance(gpu, MigSlice)
    layout = snapshot.layout
    allowed = layout.model_mask(request.allowed_models)[row]
    best: tuple[tuple[int, int, int, int], int, int] | None = None
    for index in range(layout.max_gpus):
        if not (allowed[index] and snapshot.gpu_mig_mode[row, index] and snapshot.gpu_healthy[row, index]):
            continue
        profile = mig_profile(layout.models[layout.gpu_model[row, index]], gpu.profile)
        if profile is None:
            continue
        used = int(snapshot.mig_used[row, index])
        family = MIG_FAMILY_NAMES[layout.mig_family[row, index]]
        for start in free_starts(profile, used):
            after = used | profile.mask_at(start)
            rank = (free_slices(used), MIG_MEMORY_SLICES - largest_placeable(family, after), index, start)
            if best is None or rank < best[0]:
                best = (rank, index, start)
    if best is None:
        raise ValueError(f"no free MIG position for {gpu.profile}")
    return best[1], best[2]


def bind(
    snapshot: ClusterSnapshot, request: PodRequest, row: int, share_gpu: int | None = None
) -> Binding:
    """The binding of ``request`` on node ``row`` (which must be feasible for it)."""
    node_id = snapshot.layout.nodes[row].id
    common = {"node_id": node_id, "cpu_milli": request.cpu_milli, "memory_mib": request.memory_mib}
    gpu = request.gpu
    if gpu is None:
        return Binding(**common)
    if isinstance(gpu, MigSlice):
        index, start = _mig_choice(snapshot, request, row)
        return Binding(gpu_indices=(index,), mig=MigPlacement(gpu.profile, start), **common)
    free = snapshot.share_free[row]
    if request.allowed_models:
        free = np.where(snapshot.layout.model_mask(request.allowed_models)[row], free, 0)
    if isinstance(gpu, GpuShare):
        index = _share_gpu(snapshot, request, row, free) if share_gpu is None else int(share_gpu)
        return Binding(gpu_indices=(index,), gpu_milli=gpu.milli, gpu_memory_mib=gpu.memory_mib, **common)
    assert isinstance(gpu, WholeGpus)
    indices = select_whole_gpus(free, snapshot.layout.nvlink_domain[row], gpu.count)
    return Binding(gpu_indices=indices, gpu_milli=MILLI_PER_GPU, **common)
