"""The node labels an agent discovers from its inventory (pure), named as NVIDIA's GPU feature discovery
names them, so the node selectors of pod specs written for Kubernetes GPU nodes (``nvidia.com/gpu.present:
"true"``, ``nvidia.com/gpu.count``, ``nvidia.com/gpu.memory``, ``nvidia.com/cuda.driver.major``) match
gpusched's nodes too. An operator's own labels (``GPUSCHED_NODE_LABELS``) win over discovered ones."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpusched_common.events import GpuInventory

from gpusched_core.placement.mig import mig_family

PREFIX = "nvidia.com/"


def discovered_labels(gpus: Sequence[GpuInventory], driver_version: str | None,
                      cuda_version: str | None) -> dict[str, str]:
    """GFD's labels for a node with ``gpus`` (those of its first GPU's model where they describe one GPU; a
    node of several models is labelled by its first, as GFD does)."""
    if not gpus:
        return {}
    first = min(gpus, key=lambda g: g.index)
    labels = {f"{PREFIX}gpu.present": "true", f"{PREFIX}gpu.count": str(len(gpus)),
              f"{PREFIX}gpu.product": product_label(first.product or first.model),
              f"{PREFIX}gpu.memory": str(first.memory_mib),
              f"{PREFIX}mig.capable": "true" if mig_family(first.model, first.memory_mib) else "false"}
    labels.update(_version("cuda.driver", driver_version, ("major", "minor", "rev")))
    labels.update(_version("cuda.runtime", cuda_version, ("major", "minor")))
    return labels


def product_label(name: str) -> str:
    """A product name as a label value: spaces as dashes, only what a label value may hold, at most 63."""
    text = "".join(c if c.isalnum() or c in "-_." else "-" for c in name.strip().replace(" ", "-"))
    return text.strip("-_.")[:63].rstrip("-_.")


def node_labels(discovered: Mapping[str, str], operator: Mapping[str, str]) -> dict[str, str]:
    """What a node registers with: the discovered labels, then the operator's (which win)."""
    return {**discovered, **operator}


def _version(name: str, version: str | None, parts: tuple[str, ...]) -> dict[str, str]:
    numbers = (version or "").strip().split(".")
    if not all(n.isdigit() for n in numbers[: len(parts)]) or not numbers[0]:
        return {}
    return {f"{PREFIX}{name}.{part}": str(int(value)) for part, value in zip(parts, numbers, strict=False)}
