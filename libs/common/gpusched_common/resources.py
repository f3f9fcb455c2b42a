"""GPU model names and the limits of a request (DESIGN.md section 5).

A GPU model is named by rule, never by a closed table: ``canonical_model`` reads an NVML product name
(``NVIDIA A100-SXM4-80GB``, ``NVIDIA H100 NVL``, ``Tesla T4``) or a GPU feature discovery label value
(``NVIDIA-A100-SXM4-80GB-MIG-1g.10gb``, ``NVIDIA-L40S-SHARED``) as ``FAMILY[-FORM]-<GB>GB``:

- the family is what is left of the name without the brand (NVIDIA, Tesla, Quadro, GeForce), the memory
  type (HBM3, GDDR6X), the word GPU and GPU feature discovery's suffixes (-SHARED, -MIG-<profile>):
  ``H100``, ``A100``, ``L40S``, ``RTX-4090``, ``RTX-A6000``, ``GH200``;
- the form factor where it matters: ``PCIE`` and ``NVL`` cards are named so; SXM, the default, is not
  (``A100-80GB`` is the SXM4 part, ``A100-PCIE-40GB`` the card);
- the memory class in GB: from the memory NVML reports when it is known (a node's inventory), snapped to
  the sizes GPUs are sold with, else from the name (``80GB``); a Grace superchip's name carries the
  module's memory (``GH200 480GB``: its CPU's and GPU's together), which is no GPU's memory class. A name
  with no memory class where none is known stays without one (``B200``): such a partial name is resolved
  against the models a cluster has (``gpusched_core.gpu_models``).

So ``NVIDIA H100 80GB HBM3`` is ``H100-80GB`` and ``NVIDIA H200`` with 143771 MiB is ``H200-141GB``: the
names stored before this rule existed are what it gives."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_GPUS_PER_JOB = 8  # whole GPUs per node (per gang member)
MAX_GANG_NODES = 64
MAX_CPU_MILLI_PER_NODE = 1_024_000  # host CPU a job may ask for on one node (1,024 cores)
MAX_MEMORY_MIB_PER_NODE = 16 * 1024 * 1024  # host memory a job may ask for on one node (16 TiB)

MAX_PRIORITY = 1000
MAX_COMMAND_BYTES = 64 * 1024
MAX_SUBMISSION_BYTES = 1024 * 1024

MAX_MODEL_NAME_CHARS = 100
# the memory sizes GPUs are sold with, in GB; NVML reports a little less than the nominal size (an L40S:
# 46068 MiB, about 45 GiB, of its 48 GB), never more, so a reported size is snapped up to the smallest of
# these at most MEMORY_SNAP above it, else rounded up to whole GiB
MEMORY_CLASSES_GB = (1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144,
                     180, 186, 192, 256, 288)
MEMORY_SNAP = 0.08
_BRANDS = frozenset({"NVIDIA", "TESLA", "QUADRO", "GEFORCE", "GPU", "GENERATION", "HGX", "DGX"})
_DEFAULT_FORMS = re.compile(r"^SXM\d?$")
_FORMS = frozenset({"PCIE", "NVL"})
_MEMORY_TYPE = re.compile(r"^(?:HBM\d?E?|G?DDR\d+X?|LPDDR\d+X?)$")
_MEMORY = re.compile(r"^(\d{1,4})GB?$")
_TOKEN = re.compile(r"^[A-Z0-9.+]+$")
_SUPERCHIP = re.compile(r"^G[A-Z]\d+")  # a Grace CPU with its GPU on one module: GH200, GB200
SUPERCHIP_MODULE_GB = 256  # a size in a superchip's name at least this big is the module's memory
# GPU feature discovery appends these to nvidia.com/gpu.product: time-slicing/MPS, and a MIG strategy
_GFD_SUFFIX = re.compile(r"(?:-(?:SHARED|MIG(?:-(?:\d+C\.)?\d+G\.\d+GB(?:\+ME)?)?))+$")


@dataclass(frozen=True)
class GpuName:
    """A model name read by rule: family, form factor (None: the default, SXM or the only one) and memory
    class in GB (None: the name gives none)."""

    family: str
    form: str | None = None
    memory_gb: int | None = None

    def named(self, memory_gb: int | None = None) -> str:
        """The canonical name, with ``memory_gb`` (the inventory's class) in place of the name's."""
        memory = memory_gb if memory_gb is not None else self.memory_gb
        return "-".join(p for p in (self.family, self.form, f"{memory}GB" if memory is not None else None) if p)

    @property
    def kind(self) -> tuple[str, str | None]:
        """Family and form factor: what a name without a memory class can be matched on."""
        return self.family, self.form


def parse_gpu_name(name: str) -> GpuName | None:
    """The parts of an NVML product name, a GPU feature discovery label value or a canonical name (None:
    it is no GPU model name: empty, too long, characters no model has, or no digit in its family)."""
    text = name.strip().upper()
    if not text or len(text) > MAX_MODEL_NAME_CHARS:
        return None
    text = re.sub(r"[\s_]+", "-", text)
    text = _GFD_SUFFIX.sub("", text)
    tokens = [t for t in text.split("-") if t]
    if not tokens or not all(_TOKEN.match(t) for t in tokens):
        return None
    family: list[str] = []
    form: str | None = None
    sizes: list[tuple[int, bool]] = []  # (GB, followed by its memory type)
    for token in tokens:
        size = _MEMORY.match(token)
        if token in _BRANDS or _DEFAULT_FORMS.match(token):
            continue
        if token in _FORMS:
            form = token
        elif size:
            sizes.append((int(size.group(1)), False))
        elif _MEMORY_TYPE.match(token):
            if sizes:
                sizes[-1] = (sizes[-1][0], True)
        else:
            family.append(token)
    if not family or not any(ch.isdigit() for ch in "".join(family)):
        return None
    joined = "-".join(family)
    if _SUPERCHIP.match(joined):  # its size is the module's unless it names the GPU's HBM or is small
        sizes = [(gb, typed) for gb, typed in sizes if typed or gb < SUPERCHIP_MODULE_GB]
    return GpuName(joined, form, sizes[0][0] if sizes and sizes[0][0] > 0 else None)


def strip_gfd_suffix(name: str) -> str:
    """``name`` without GPU feature discovery's -SHARED and -MIG-<profile> suffixes."""
    return _GFD_SUFFIX.sub("", re.sub(r"[\s_]+", "-", name.strip()).upper()) if name.strip() else name


def memory_class_gb(memory_mib: int) -> int | None:
    """The memory class of a GPU reporting ``memory_mib`` (None: it reports none)."""
    if memory_mib <= 0:
        return None
    gib = memory_mib / 1024
    above = [size for size in MEMORY_CLASSES_GB if gib * 0.995 <= size <= gib * (1 + MEMORY_SNAP)]
    return above[0] if above else math.ceil(gib - 0.01)


def canonical_model(name: str, memory_mib: int | None = None) -> str | None:
    """The canonical name of a GPU model (None: ``name`` is no model name), its memory class from
    ``memory_mib`` (what NVML reports) when given, else from the name; without either it has none."""
    parsed = parse_gpu_name(name)
    if parsed is None:
        return None
    return parsed.named(memory_class_gb(memory_mib) if memory_mib else None)


def model_memory_class_mib(name: str) -> int | None:
    """The memory of a model by its name's class, in MiB (None: the name gives none), for a model no node
    has reported yet."""
    parsed = parse_gpu_name(name)
    return parsed.memory_gb * 1024 if parsed is not None and parsed.memory_gb is not None else None
