"""Policies by name: the only way services and the simulator obtain a policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .fgd import FgdPolicy
from .fragmentation import RequestShape, WorkloadDistribution
from .model import MILLI_PER_GPU
from .frag_aware import FragAwarePolicy
from .policies import BestFitPolicy, DotProductPolicy, PackingPolicy, PlacementPolicy, RandomPolicy


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """What a policy may be built from: a seed (``random`` only) and the workload (FGD and ours)."""

    seed: int = 0
    workload: WorkloadDistribution | None = None


@dataclass(frozen=True, slots=True)
class PolicyInfo:
    name: str
    description: str
    published_as: str | None  # the policy's name in the FGD artifact's released results
    own: bool  # one of ours (a candidate to beat FGD)


def default_workload() -> WorkloadDistribution:
    """A generic mix used when no workload is known: shares, 1/2/4/8 whole GPUs, CPU-only."""
    shapes = (
        RequestShape(4000, 250, 1), RequestShape(4000, 500, 1), RequestShape(8000, MILLI_PER_GPU, 1),
        RequestShape(16000, MILLI_PER_GPU, 2), RequestShape(32000, MILLI_PER_GPU, 4),
        RequestShape(64000, MILLI_PER_GPU, 8), RequestShape(8000),
    )  # fmt: skip
    weights = (0.2, 0.2, 0.3, 0.1, 0.05, 0.05, 0.1)
    return WorkloadDistribution(shapes, weights)


def _workload(settings: PolicySettings) -> WorkloadDistribution:
    return settings.workload if settings.workload is not None else default_workload()


_Factory = Callable[[PolicySettings], PlacementPolicy]

_REGISTRY: dict[str, tuple[_Factory, PolicyInfo]] = {}


def _register(info: PolicyInfo, factory: _Factory) -> None:
    _REGISTRY[info.name] = (factory, info)


_register(PolicyInfo("random", "uniformly random feasible node (seeded)", "01-Random", False),
          lambda s: RandomPolicy(seed=s.seed))  # fmt: skip
_register(PolicyInfo("dotprod", "smallest dot product of free and requested CPU/GPU", "02-DotProd", False),
          lambda s: DotProductPolicy())  # fmt: skip
_register(PolicyInfo("packing", "shared GPUs, then used nodes, then idle nodes", "04-GpuPacking", False),
          lambda s: PackingPolicy())  # fmt: skip
_register(PolicyInfo("bestfit", "least weighted CPU/GPU leftover", "05-BestFit", False),
          lambda s: BestFitPolicy())  # fmt: skip
_register(PolicyInfo("fgd", "fragmentation gradient descent (ATC'23), as published", "06-FGD", False),
          lambda s: FgdPolicy(_workload(s)))  # fmt: skip
_register(PolicyInfo("fgd-exact", "FGD without score truncation (ablation)", None, False),
          lambda s: FgdPolicy(_workload(s), name="fgd-exact", quantized=False))  # fmt: skip
# The generic mix is itself a handful of typical shapes, not a trace's long tail: cut at FGD's 95%, as the live
# service (which builds ``ours`` from it) always has, not at the 90% ``ours`` uses on a real workload.
GENERIC_POPULARITY = 0.95


def _ours(settings: PolicySettings) -> PlacementPolicy:
    if settings.workload is None:
        return FragAwarePolicy(default_workload(), popularity=GENERIC_POPULARITY)
    return FragAwarePolicy(settings.workload)


_register(PolicyInfo("ours", "FGD score (growth + cost of GPUs constrained demand still needs + cost of GPUs memory "
                    "can no longer serve), ties by CPU-capped fragmentation growth, then node order", None, True),
          _ours)  # fmt: skip


def policy_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def policy_infos() -> tuple[PolicyInfo, ...]:
    return tuple(info for _, info in _REGISTRY.values())


def make_policy(name: str, *, seed: int = 0, workload: WorkloadDistribution | None = None) -> PlacementPolicy:
    """Build the policy registered as ``name``; raises ``KeyError`` with the known names."""
    try:
        factory, _ = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None
    return factory(PolicySettings(seed=seed, workload=workload))
