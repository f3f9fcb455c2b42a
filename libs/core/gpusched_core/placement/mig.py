"""MIG geometry, the one home of it: slices per GPU, the profiles of each MIG-capable model we know the
geometry of (A100 40 and 80 GB, H100 80 GB, H100 NVL 94 GB, H200 141 GB, GH200 96 GB, B200 180 GB) and where
each may start, and how profiles are named (quota charges a slice by its compute slices, node agents name
the instances NVML reports, the gpu_allocations CHECK of migration 009 is tested against these).

A MIG-capable GPU has 8 memory slices and 7 compute slices. A profile occupies ``memory_slices``
consecutive memory slices starting at one of its valid ``starts`` (NVIDIA's placement table). With
these start positions no combination can use more than 7 compute slices, so occupancy is tracked as
an 8-bit mask of memory slices per GPU. The families share this geometry and differ only in the memory
each profile names (NVIDIA's names: a B200's 3g profile is 3g.90gb). A model is in a family by rule
(``mig_family``: its canonical name, a PCIe card with its SXM part); a model of no family is offered no MIG.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from gpusched_common.resources import memory_class_gb, parse_gpu_name

MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7
FULL_MIG_MASK = (1 << MIG_MEMORY_SLICES) - 1
# the memory, in GB, NVIDIA's profile names give 1, 2, 4 and 8 memory slices of each MIG family (keyed by
# the canonical model; a PCIe card is in the family of its SXM part: ``mig_family``)
MIG_SIZES_GB: dict[str, tuple[int, int, int, int]] = {
    "A100-40GB": (5, 10, 20, 40),
    "A100-80GB": (10, 20, 40, 80),
    "H100-80GB": (10, 20, 40, 80),
    "H100-NVL-94GB": (12, 24, 47, 94),
    "H200-141GB": (18, 35, 71, 141),
    "H200-NVL-141GB": (18, 35, 71, 141),
    "GH200-96GB": (12, 24, 48, 96),
    "B200-180GB": (23, 45, 90, 180),
}
_PROFILE_NAME = re.compile(r"^(\d)g\.(\d+)gb$")


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]

    def mask_at(self, start: int) -> int:
        return ((1 << self.memory_slices) - 1) << start


def _family(sizes: tuple[int, int, int, int]) -> dict[str, MigProfile]:
    """Profiles of one family, named by memory in GB: 1g of 1 and of 2 memory slices, 2g of 2, 3g and 4g of
    4, 7g of all 8."""
    one, two_slices, four_slices, eight = sizes
    one_small, one_large, two, three, four, seven = one, two_slices, two_slices, four_slices, four_slices, eight
    profiles = (
        MigProfile(f"1g.{one_small}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{one_large}gb", 1, 2, (0, 2, 4, 6)),
        MigProfile(f"2g.{two}gb", 2, 2, (0, 2, 4)),
        MigProfile(f"3g.{three}gb", 3, 4, (0, 4)),
        MigProfile(f"4g.{four}gb", 4, 4, (0,)),
        MigProfile(f"7g.{seven}gb", MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, (0,)),
    )
    return {profile.name: profile for profile in profiles}


MIG_FAMILIES: dict[str, dict[str, MigProfile]] = {family: _family(sizes) for family, sizes in MIG_SIZES_GB.items()}


def mig_family(model: str, memory_mib: int | None = None) -> str | None:
    """The MIG family of a GPU model name (``NVIDIA-A100-SXM4-80GB`` -> ``A100-80GB``, ``A100-PCIE-40GB`` ->
    ``A100-40GB``), if any: its canonical name, a PCIe card's as its SXM part's (the same geometry)."""
    parsed = parse_gpu_name(model)
    if parsed is None:
        return None
    memory = memory_class_gb(memory_mib) if memory_mib else parsed.memory_gb
    for form in dict.fromkeys((parsed.form, None if parsed.form == "PCIE" else parsed.form)):
        name = replace(parsed, form=form).named(memory)
        if name in MIG_FAMILIES:
            return name
    return None


def mig_profile(model: str, profile: str) -> MigProfile | None:
    family = mig_family(model)
    if family is None:
        return None
    return MIG_FAMILIES[family].get(profile)


def memory_slices_of(family: str, profile: str) -> int | None:
    """How many memory slices ``profile`` takes on a GPU of ``family`` (None: no such profile there)."""
    found = MIG_FAMILIES.get(family, {}).get(profile)
    return found.memory_slices if found is not None else None


def free_starts(profile: MigProfile, used_mask: int) -> tuple[int, ...]:
    """Valid start slices of ``profile`` that do not overlap ``used_mask``."""
    return tuple(start for start in profile.starts if not used_mask & profile.mask_at(start))


def coverable_mask(profile: MigProfile, used_mask: int) -> int:
    """Free memory slices that some free placement of ``profile`` would cover."""
    covered = 0
    for start in free_starts(profile, used_mask):
        covered |= profile.mask_at(start)
    return covered


def free_slices(used_mask: int) -> int:
    return MIG_MEMORY_SLICES - bin(used_mask & FULL_MIG_MASK).count("1")


def stranded_slices(profile: MigProfile, used_mask: int) -> int:
    """Free slices that no free placement of ``profile`` can use: MIG fragmentation for that profile."""
    free_mask = ~used_mask & FULL_MIG_MASK
    return bin(free_mask & ~coverable_mask(profile, used_mask)).count("1")


def largest_placeable(family: str, used_mask: int) -> int:
    """Memory slices of the largest profile of ``family`` that still has a free position."""
    best = 0
    for profile in MIG_FAMILIES[family].values():
        if profile.memory_slices > best and free_starts(profile, used_mask):
            best = profile.memory_slices
    return best


def mig_profile_name(compute_slices: int, memory_mib: int, model: str | None = None) -> str:
    """NVML reports slices and usable memory (a little under the nominal size: 3g.40gb has 40192 MiB);
    profiles are named `<slices>g.<GB>gb`. For a known model the size snaps to its slice multiples."""
    gb = memory_mib / 1024
    family = mig_family(model) if model else None
    if family is not None:
        nominal = min(MIG_SIZES_GB[family], key=lambda size: abs(size - gb))
        return f"{compute_slices}g.{nominal}gb"
    return f"{compute_slices}g.{max(1, math.ceil(gb - 0.05))}gb"


def parse_mig_profile(profile: str) -> tuple[int, int]:
    """`3g.40gb` -> (3 compute slices, 40 GB); raises ValueError."""
    match = _PROFILE_NAME.match(profile.strip().lower())
    if not match:
        raise ValueError(f"MIG profile {profile!r} is not like 3g.40gb")
    return int(match.group(1)), int(match.group(2))
