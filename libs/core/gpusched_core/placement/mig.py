"""MIG geometry, the one home of it: slices per GPU, the profiles of A100-40GB, A100-80GB and H100-80GB and
where each may start, and how profiles are named (quota charges a slice by its compute slices, node agents
name the instances NVML reports, the gpu_allocations CHECK of migration 009 is tested against these).

A MIG-capable GPU has 8 memory slices and 7 compute slices. A profile occupies ``memory_slices``
consecutive memory slices starting at one of its valid ``starts`` (NVIDIA's placement table). With
these start positions no combination can use more than 7 compute slices, so occupancy is tracked as
an 8-bit mask of memory slices per GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MIG_MEMORY_SLICES = 8
MIG_COMPUTE_SLICES = 7
FULL_MIG_MASK = (1 << MIG_MEMORY_SLICES) - 1
# memory per MIG memory slice, in GB, of the MIG-capable models we know (placement places slices on the
# families below; H200 instances are named, not yet placed)
MIG_SLICE_GB = {"A100-40GB": 5, "A100-80GB": 10, "H100-80GB": 10, "H200-141GB": 18}
_PROFILE_NAME = re.compile(r"^(\d)g\.(\d+)gb$")


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]

    def mask_at(self, start: int) -> int:
        return ((1 << self.memory_slices) - 1) << start


def _family(slice_gb: int) -> dict[str, MigProfile]:
    """Profiles of one family, named by memory in GB: 1g of 1 and of 2 memory slices, 2g of 2, 3g and 4g of
    4, 7g of all 8."""
    one_small, one_large, two, three, four, seven = (slice_gb * n for n in (1, 2, 2, 4, 4, MIG_MEMORY_SLICES))
    profiles = (
        MigProfile(f"1g.{one_small}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigProfile(f"1g.{one_large}gb", 1, 2, (0, 2, 4, 6)),
        MigProfile(f"2g.{two}gb", 2, 2, (0, 2, 4)),
        MigProfile(f"3g.{three}gb", 3, 4, (0, 4)),
        MigProfile(f"4g.{four}gb", 4, 4, (0,)),
        MigProfile(f"7g.{seven}gb", MIG_COMPUTE_SLICES, MIG_MEMORY_SLICES, (0,)),
    )
    return {profile.name: profile for profile in profiles}


MIG_FAMILIES: dict[str, dict[str, MigProfile]] = {
    family: _family(MIG_SLICE_GB[family]) for family in ("A100-40GB", "A100-80GB", "H100-80GB")
}


def mig_family(model: str) -> str | None:
    """The MIG family of a GPU model name (``NVIDIA-A100-SXM4-80GB`` -> ``A100-80GB``), if any."""
    name = model.upper()
    if "H100" in name:
        return "H100-80GB" if "94" not in name and "96" not in name else None
    if "A100" in name:
        return "A100-80GB" if "80" in name else "A100-40GB"
    return None


def mig_profile(model: str, profile: str) -> MigProfile | None:
    family = mig_family(model)
    if family is None:
        return None
    return MIG_FAMILIES[family].get(profile)


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
    slice_gb = MIG_SLICE_GB.get(model or "")
    if slice_gb is not None:
        nominal = min((slice_gb * k for k in (1, 2, 4, MIG_MEMORY_SLICES)), key=lambda size: abs(size - gb))
        return f"{compute_slices}g.{nominal}gb"
    return f"{compute_slices}g.{max(1, math.ceil(gb - 0.05))}gb"


def parse_mig_profile(profile: str) -> tuple[int, int]:
    """`3g.40gb` -> (3 compute slices, 40 GB); raises ValueError."""
    match = _PROFILE_NAME.match(profile.strip().lower())
    if not match:
        raise ValueError(f"MIG profile {profile!r} is not like 3g.40gb")
    return int(match.group(1)), int(match.group(2))
