"""Trace variants along the axes of the FGD paper (ATC'23, section 6), generated from an openb pod list.

The paper runs 17 openb traces; only some are shared (``../shared/traces``). The others differ from
``default`` by one axis each, and comparing the shared ones with ``default`` shows how (the axis
labels of the paper's figures 11-14 name the unit):

- ``gpuspecNN``: NN% of the GPU requested (milli) comes from pods pinned to GPU models. In
  ``gpuspec10`` the pods are those of ``default``, in the same order; about one GPU pod in ten, of
  every shape alike, got a ``gpu_spec`` and nothing else changed. The models named are not in
  proportion to the node list's GPUs: most constrained pods name T4 (14% of the GPUs) or P100 (4%),
  and what a pod names depends on its kind (shares: T4 or P100; one whole GPU: T4, G2, the V100s;
  several GPUs: G2, whose nodes have 8). So we pin uniformly chosen GPU pods, each to a spec drawn
  from ``gpuspec10``'s specs for its kind (``SPEC_POOL``), until the share is reached.
- ``gpushareNN``: GPU-sharing pods ask for NN% of the GPU requested. ``gpushare40`` keeps the pod
  count: non-sharing GPU pods are replaced by copies of sharing pods (so the GPU requested falls).
- ``multigpuNN``: multi-GPU pods ask for NN% of the GPU requested. ``multigpu20`` adds copies of
  multi-GPU pods and removes nothing.
- ``cpuNNN``: CPU-only pods are NNN/10 % of the pods (``cpu050``: 5%). ``cpu050`` removes CPU-only
  pods of ``default`` (13% of its pods); higher levels add copies of them.

Every variant is a pure function of the base pods, the name and a seed (``numpy`` generator seeded
with the seed and the family, not the level, so a family's levels are nested: ``gpuspec25`` pins the
pods of ``gpuspec20`` and more). Level 0 of ``gpuspec`` and the name ``default`` return the base
unchanged. Copies are named ``<pod>-<family>-<i>``; the result is sorted by name, as ``load_pods``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched_core.placement import GpuShare, PodRequest, RequestId, WholeGpus

from ..traces.openb import TracePod

FAMILIES = ("gpuspec", "gpushare", "multigpu", "cpu")

# The levels the FGD paper ran (``fgd-published-results``), as variant names.
PUBLISHED_VARIANTS = (
    "cpu050", "cpu100", "cpu200", "cpu250",
    "gpushare40", "gpushare60", "gpushare80", "gpushare100",
    "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
)  # fmt: skip

# Specs of the constrained pods of the shared gpuspec10 trace, by pod kind (counts; a spec that names a
# model twice, 'V100M16|V100M32|V100M32', is counted as the set it means).
SPEC_POOL: dict[str, tuple[tuple[str, int], ...]] = {
    "share": (("T4", 163), ("P100", 98), ("G2|P100|T4|V100M16|V100M32", 9)),
    "whole": (
        ("T4", 192), ("G2", 112), ("V100M16|V100M32", 61), ("P100|V100M16|V100M32", 26), ("G3", 17),
        ("G2|P100|T4|V100M16|V100M32", 11), ("A10|G2|T4|V100M16|V100M32", 9), ("P100|V100M16", 6),
        ("P100|T4|V100M16|V100M32", 5), ("V100M16", 4), ("V100M32", 4), ("A10|G2|P100|T4|V100M16|V100M32", 3),
        ("P100", 2), ("A10|T4", 1),
    ),
    "multi": (("G2", 8), ("T4|V100M16|V100M32", 1)),
}  # fmt: skip

_NAME = re.compile(r"^(gpuspec|gpushare|multigpu|cpu)(\d+)$")


@dataclass(frozen=True, slots=True)
class Variant:
    """A parsed variant name: the family and its level in percent."""

    family: str
    level_pct: float

    @property
    def name(self) -> str:
        if self.family == "cpu":
            return f"cpu{round(self.level_pct * 10):03d}"
        return f"{self.family}{round(self.level_pct)}"


def parse_variant(name: str) -> Variant | None:
    """``gpuspec25`` -> Variant('gpuspec', 25.0); ``cpu050`` -> 5%; ``default`` -> None (the base)."""
    text = name.strip()
    if text == "default":
        return None
    match = _NAME.match(text)
    if match is None:
        raise ValueError(f"unknown trace variant {name!r}; e.g. default, {', '.join(PUBLISHED_VARIANTS[:4])}, ...")
    family, digits = match.groups()
    level = int(digits) / 10.0 if family == "cpu" else float(int(digits))
    if not 0 <= level <= 100:
        raise ValueError(f"variant level out of 0-100%: {name!r}")
    return Variant(family, level)


def kind_of(request: PodRequest) -> str:
    """``cpu`` (no GPU), ``share`` (part of one GPU), ``whole`` (one GPU) or ``multi`` (several)."""
    gpu = request.gpu
    if isinstance(gpu, GpuShare):
        return "share"
    if isinstance(gpu, WholeGpus):
        return "whole" if gpu.count == 1 else "multi"
    return "cpu"


def _renamed(pod: TracePod, name: str, allowed_models: frozenset[str] | None = None) -> TracePod:
    r = pod.request
    models = r.allowed_models if allowed_models is None else allowed_models
    return TracePod(PodRequest(RequestId(name), r.gpu, r.cpu_milli, r.memory_mib, models, r.node_selector), pod.gpu_milli)


def _share_of(pods: Sequence[TracePod], kinds: set[str]) -> tuple[int, int]:
    """(GPU milli of pods of ``kinds``, GPU milli of all pods)."""
    part = sum(p.gpu_milli for p in pods if kind_of(p.request) in kinds)
    return part, sum(p.gpu_milli for p in pods)


def _pinned(pods: list[TracePod], level: float, rng: np.random.Generator) -> list[TracePod]:
    pools = {kind: ([s for s, _ in pool], np.array([c for _, c in pool], float)) for kind, pool in SPEC_POOL.items()}
    total = sum(p.gpu_milli for p in pods)
    pinned = sum(p.gpu_milli for p in pods if p.request.allowed_models)
    gpu_pods = [i for i, p in enumerate(pods) if p.gpu_milli > 0 and not p.request.allowed_models]
    order = rng.permutation(len(gpu_pods))
    specs = rng.random(len(gpu_pods))  # one draw per candidate, so levels stay nested
    out = list(pods)
    for k in order:
        if pinned >= level / 100.0 * total:
            break
        pod = pods[gpu_pods[k]]
        names, counts = pools[kind_of(pod.request)]
        spec = names[int(np.searchsorted(np.cumsum(counts) / counts.sum(), specs[k], side="right"))]
        out[gpu_pods[k]] = _renamed(pod, str(pod.request.id), frozenset(spec.split("|")))
        pinned += pod.gpu_milli
    return out


def _shared(pods: list[TracePod], level: float, rng: np.random.Generator) -> list[TracePod]:
    sharing = [p for p in pods if kind_of(p.request) == "share"]
    others = [i for i, p in enumerate(pods) if kind_of(p.request) in ("whole", "multi")]
    if not sharing:
        raise ValueError("gpushare needs sharing pods to copy")
    part, total = _share_of(pods, {"share"})
    out = list(pods)
    for n, k in enumerate(rng.permutation(len(others))):
        if part >= level / 100.0 * total:
            break
        copy = sharing[int(rng.integers(len(sharing)))]
        replaced = pods[others[k]]
        out[others[k]] = _renamed(copy, f"{copy.request.id}-gpushare-{n}")
        part, total = part + copy.gpu_milli, total - replaced.gpu_milli + copy.gpu_milli
    return out


def _multi(pods: list[TracePod], level: float, rng: np.random.Generator) -> list[TracePod]:
    multi = [p for p in pods if kind_of(p.request) == "multi"]
    if not multi:
        raise ValueError("multigpu needs multi-GPU pods to copy")
    part, total = _share_of(pods, {"multi"})
    out = list(pods)
    while part < level / 100.0 * total and level < 100:
        copy = multi[int(rng.integers(len(multi)))]
        out.append(_renamed(copy, f"{copy.request.id}-multigpu-{len(out) - len(pods)}"))
        part, total = part + copy.gpu_milli, total + copy.gpu_milli
    return out


def _cpu(pods: list[TracePod], level: float, rng: np.random.Generator) -> list[TracePod]:
    cpu = [i for i, p in enumerate(pods) if kind_of(p.request) == "cpu"]
    if level >= 100 or not cpu:
        raise ValueError("cpu variants need CPU-only pods and a level under 100%")
    gpu_count = len(pods) - len(cpu)
    wanted = round(level / (100.0 - level) * gpu_count)
    if wanted <= len(cpu):
        dropped = {cpu[k] for k in rng.permutation(len(cpu))[: len(cpu) - wanted]}
        return [p for i, p in enumerate(pods) if i not in dropped]
    copies = [pods[cpu[int(rng.integers(len(cpu)))]] for _ in range(wanted - len(cpu))]
    return list(pods) + [_renamed(p, f"{p.request.id}-cpu-{n}") for n, p in enumerate(copies)]


_MAKERS = {"gpuspec": _pinned, "gpushare": _shared, "multigpu": _multi, "cpu": _cpu}


def make_variant(pods: Sequence[TracePod], name: str, seed: int = 0) -> list[TracePod]:
    """The pods of variant ``name`` generated from ``pods`` (a base list, e.g. ``default``), sorted by name."""
    variant = parse_variant(name)
    if variant is None or (variant.family == "gpuspec" and variant.level_pct == 0):
        return list(pods)
    rng = np.random.default_rng([seed, FAMILIES.index(variant.family)])
    out = _MAKERS[variant.family](list(pods), variant.level_pct, rng)
    out.sort(key=lambda pod: pod.request.id)
    return out
