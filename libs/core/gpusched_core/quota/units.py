"""Quota units: whole GPUs, MIG slices and fractional shares charged in one integer unit.

Quota is enforced per flavor (a GPU model) in integer *units*: one GPU is ``UNITS_PER_GPU`` units,
so a milli-share, a MIG slice of a 7-slice or 4-slice GPU and a whole GPU are all exact integers and
the invariants ("never above nominal + borrowing") are checked without rounding. Fair share adds
usage across flavors in *GPU-equivalents* (GEQ): ``units / UNITS_PER_GPU * gpu_equivalents[model]``,
configurable per model (an H100 may count as 2 A100s).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_core.placement.mig import MIG_COMPUTE_SLICES, parse_mig_profile
from gpusched_core.placement.model import MILLI_PER_GPU

# Divisible by 1000 (milli shares), 7 (A100 / H100 MIG slices) and 4 (A30 MIG slices).
UNITS_PER_GPU = 7000
DEFAULT_MIG_SLICES = MIG_COMPUTE_SLICES


class UnitError(ValueError):
    """A request that cannot be expressed in quota units (unknown MIG profile shape, bad share)."""


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """What a job asks for, as in the resource model: exactly one of whole GPUs (``gpus``, the total
    over a gang), a fraction of one GPU (``share_milli``) or one MIG slice (``mig_profile``).
    ``models`` lists allowed GPU models (flavors) in order of preference; empty means any flavor."""

    gpus: int = 0
    share_milli: int = 0
    mig_profile: str | None = None
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QuotaAsk:
    """The charge of one job: (flavor, units) options in order of preference. The first option that
    fits the tenant's quota is the one reserved (flavor assignment)."""

    options: tuple[tuple[str, int], ...]

    @property
    def flavor(self) -> str:
        return self.options[0][0]

    @property
    def units(self) -> int:
        return self.options[0][1]


def whole_gpus(count: int, flavor: str) -> QuotaAsk:
    """The common case: ``count`` whole GPUs of one flavor."""
    return QuotaAsk(((flavor, count * UNITS_PER_GPU),))


def gpus_to_units(gpus: float) -> int:
    """GPUs (possibly fractional, as written in a quota file) to units, rounded to the nearest unit."""
    return int(round(gpus * UNITS_PER_GPU))


def units_to_gpus(units: int | float) -> float:
    return units / UNITS_PER_GPU


def format_gpus(units: int | float) -> str:
    """``112000`` -> ``"16"``; ``3500`` -> ``"0.5"``: at most three decimals, no trailing zeros."""
    if units % UNITS_PER_GPU == 0:
        return str(int(units // UNITS_PER_GPU))
    text = f"{units / UNITS_PER_GPU:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def mig_slices(profile: str) -> int:
    """Compute slices of a MIG profile name such as ``3g.40gb`` (the number before ``g``)."""
    try:
        return parse_mig_profile(profile)[0]
    except ValueError:
        raise UnitError(f"unknown MIG profile {profile!r}: expected a name like '3g.40gb'") from None


def units_for(ask: GpuAsk, model: str, mig_slices_per_gpu: Mapping[str, int]) -> int:
    """Units one job of ``ask`` charges on a GPU of ``model``."""
    kinds = (ask.gpus > 0) + (ask.share_milli > 0) + (ask.mig_profile is not None)
    if kinds != 1:
        raise UnitError("a request asks for exactly one of whole GPUs, a share or a MIG profile")
    if ask.gpus:
        return ask.gpus * UNITS_PER_GPU
    if ask.share_milli:
        if ask.share_milli > MILLI_PER_GPU:
            raise UnitError(f"a share is at most {MILLI_PER_GPU} milli, got {ask.share_milli}")
        return ask.share_milli * (UNITS_PER_GPU // MILLI_PER_GPU)
    total = mig_slices_per_gpu.get(model, DEFAULT_MIG_SLICES)
    slices = mig_slices(ask.mig_profile or "")
    if slices > total or (UNITS_PER_GPU * slices) % total:
        raise UnitError(f"MIG profile {ask.mig_profile!r} does not fit a {total}-slice {model}")
    return UNITS_PER_GPU * slices // total


def quota_ask(ask: GpuAsk, preferred: Iterable[str], mig_slices_per_gpu: Mapping[str, int]) -> QuotaAsk:
    """The quota charge of ``ask``: its allowed models in its own order, or, when it allows any model,
    ``preferred`` (e.g. the tenant's flavors with nominal quota first)."""
    models = ask.models or tuple(preferred)
    if not models:
        raise UnitError("no flavor to charge: the request names no model and the tenant has no quota")
    return QuotaAsk(tuple((model, units_for(ask, model, mig_slices_per_gpu)) for model in models))


def gpu_equivalents(units: int | float, model: str, equivalents: Mapping[str, float]) -> float:
    """Units of ``model`` in normalised GPU-equivalents (1.0 per GPU for a model not listed)."""
    return units / UNITS_PER_GPU * equivalents.get(model, 1.0)
