"""The cluster as the dashboard shows it (pure): every node and GPU with what holds it and how busy it is,
totals per GPU model, fragmentation, and how many jobs of the common shapes would fit right now.

A GPU's ``state``, first that applies:
  ``unhealthy``  the inventory marks it unhealthy (placement's view: it takes no work);
  ``busy``       something is allocated on it and its fresh NVML utilisation is above ``busy_pct``;
  ``idle``       something is allocated on it and it is not known busy (at or below ``busy_pct``, or no
                 fresh reading);
  ``cordoned``   nothing is allocated, but its node takes no new work (not Ready: cordoned, draining,
                 drained, lost, quarantined);
  ``free``       nothing is allocated and its node is Ready.
``allocated_milli`` is the sum of the allocations' milli (a whole GPU 1000, a share its milli, a MIG instance
its share of the 8 memory slices, as placement charges it: migration 009), at most 1000.

Schedulable capacity (``fits`` and ``fragmentation``) is that of Ready nodes only. A GPU in MIG mode
(``mig_enabled`` on a model whose MIG geometry we know, as the placement engine treats it) serves MIG
instances only; every other healthy GPU serves whole GPUs and shares.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpusched_core.placement.mig import MIG_FAMILIES, MigProfile, mig_family
from gpusched_core.placement.model import MILLI_PER_GPU

WHOLE_SHAPES = (1, 2, 4, 8)  # the common whole-GPU requests, each as likely (fragmentation) and counted (fits)
MIG_SHAPES = ("3g.40gb",)
SCHEDULABLE = "Ready"
FRAGMENTATION_EXPLAIN = (
    "The share of free GPU capacity on Ready nodes (non-MIG, healthy GPUs; a partly allocated GPU counts its "
    "free remainder) that a request of 1, 2, 4 or 8 whole GPUs on one node, each equally likely, could not use: "
    "per request size, the free capacity of nodes with fewer entirely free GPUs than the request, plus every "
    "partly allocated GPU's remainder (the FGD measure for whole GPUs).")


@dataclass(frozen=True, slots=True)
class NodeRow:
    node_id: str
    hostname: str
    state: str  # Ready | Lost | Quarantined | Cordoned | Draining | Drained (the gateway's node_state)


@dataclass(frozen=True, slots=True)
class GpuRow:
    node_id: str
    index: int
    model: str
    memory_mib: int
    healthy: bool
    mig_enabled: bool


@dataclass(frozen=True, slots=True)
class AllocationRow:
    node_id: str
    gpu_index: int
    job_id: str
    tenant: str | None
    milli: int
    memory_mib: int
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_slices: int | None = None  # memory slices of the MIG instance


@dataclass(frozen=True, slots=True)
class TelemetryRow:
    node_id: str
    gpu_index: int
    utilization_pct: float
    memory_used_mib: int
    healthy: bool
    sampled_at: datetime


@dataclass
class _Gpu:
    row: GpuRow
    mig_mode: bool
    allocations: list[AllocationRow]
    reading: TelemetryRow | None
    fresh: bool

    @property
    def milli(self) -> int:
        return min(MILLI_PER_GPU, sum(a.milli for a in self.allocations))

    @property
    def mig_used(self) -> int:
        mask = 0
        for a in self.allocations:
            if a.mig_profile is not None and a.mig_start is not None and a.mig_slices:
                mask |= ((1 << a.mig_slices) - 1) << a.mig_start
        return mask


def plan_cluster(nodes: Iterable[NodeRow], gpus: Iterable[GpuRow], allocations: Iterable[AllocationRow],
                 telemetry: Iterable[TelemetryRow], now: datetime, *, busy_pct: float = 5.0,
                 stale_after_s: float = 120.0) -> dict:
    """The /v1/cluster document (see the module docstring for the states). A reading older than
    ``stale_after_s`` at ``now`` is shown with its time but gives no utilisation (the metrics service
    stopped writing, or the node stopped reporting)."""
    by_gpu: dict[tuple[str, int], list[AllocationRow]] = {}
    for a in allocations:
        by_gpu.setdefault((a.node_id, a.gpu_index), []).append(a)
    readings = {(t.node_id, t.gpu_index): t for t in telemetry}
    families: dict[tuple[str, int], str | None] = {}
    node_gpus: dict[str, list[_Gpu]] = {}
    for g in sorted(gpus, key=lambda g: (g.node_id, g.index)):
        key = (g.node_id, g.index)
        family = families.get((g.model, g.memory_mib), "?")
        if family == "?":
            family = families[(g.model, g.memory_mib)] = mig_family(g.model, g.memory_mib)
        reading = readings.get(key)
        fresh = reading is not None and (now - reading.sampled_at).total_seconds() <= stale_after_s
        node_gpus.setdefault(g.node_id, []).append(
            _Gpu(g, g.mig_enabled and family is not None, sorted(by_gpu.get(key, []), key=_alloc_key), reading, fresh))
    node_list = sorted(nodes, key=lambda n: n.node_id)
    out_nodes = [{"node_id": n.node_id, "hostname": n.hostname, "state": n.state,
                  "gpus": [_gpu_view(g, n.state, busy_pct) for g in node_gpus.get(n.node_id, [])]}
                 for n in node_list]
    ready = [node_gpus.get(n.node_id, []) for n in node_list if n.state == SCHEDULABLE]
    return {
        "as_of": now.isoformat(),
        "busy_threshold_pct": busy_pct,
        "nodes": out_nodes,
        "models": _models(node_list, node_gpus, out_nodes),
        "fragmentation": _fragmentation(ready),
        "fits": _fits(ready, families),
        "tenants": sorted({a.tenant for g in by_gpu.values() for a in g if a.tenant}),
    }


def _alloc_key(a: AllocationRow) -> tuple:
    return (a.mig_start if a.mig_start is not None else -1, a.job_id)


def _state(g: _Gpu, node_state: str, busy_pct: float) -> str:
    if not g.row.healthy:
        return "unhealthy"
    if g.allocations:
        busy = g.fresh and g.reading is not None and g.reading.utilization_pct > busy_pct
        return "busy" if busy else "idle"
    return "free" if node_state == SCHEDULABLE else "cordoned"


def _gpu_view(g: _Gpu, node_state: str, busy_pct: float) -> dict:
    reading = g.reading
    return {
        "index": g.row.index, "model": g.row.model, "memory_mib": g.row.memory_mib, "healthy": g.row.healthy,
        "mig_enabled": g.row.mig_enabled, "state": _state(g, node_state, busy_pct), "allocated_milli": g.milli,
        "utilization_pct": reading.utilization_pct if reading is not None and g.fresh else None,
        "memory_used_mib": reading.memory_used_mib if reading is not None and g.fresh else None,
        "telemetry_at": reading.sampled_at.isoformat() if reading is not None else None,
        "allocations": [{"job_id": a.job_id, "tenant": a.tenant, "milli": a.milli, "memory_mib": a.memory_mib,
                         "mig_profile": a.mig_profile, "mig_start": a.mig_start, "mig_slices": a.mig_slices}
                        for a in g.allocations],
    }


def _models(nodes: list[NodeRow], node_gpus: dict[str, list[_Gpu]], views: list[dict]) -> list[dict]:
    totals: dict[str, dict] = {}
    for node, view in zip(nodes, views, strict=True):
        for g, gv in zip(node_gpus.get(node.node_id, []), view["gpus"], strict=True):
            m = totals.setdefault(g.row.model, {"model": g.row.model, "nodes": set(), "gpus": 0, "free": 0,
                                                "allocated": 0, "unhealthy": 0, "allocated_gpus": 0.0,
                                                "_util": [0.0, 0]})
            m["nodes"].add(node.node_id)
            m["gpus"] += 1
            m["free"] += gv["state"] == "free"
            m["allocated"] += g.milli > 0
            m["unhealthy"] += not g.row.healthy
            m["allocated_gpus"] += g.milli / MILLI_PER_GPU
            if gv["utilization_pct"] is not None:
                m["_util"][0] += gv["utilization_pct"]
                m["_util"][1] += 1
    out = []
    for model in sorted(totals):
        m = totals[model]
        util_sum, reporting = m.pop("_util")
        out.append({**m, "nodes": len(m["nodes"]), "allocated_gpus": round(m["allocated_gpus"], 4),
                    "mean_utilization_pct": round(util_sum / reporting, 2) if reporting else None})
    return out


def _whole_capacity(gpus: list[_Gpu]) -> tuple[int, float]:
    """(entirely free GPUs, free capacity in GPUs) of a node's healthy GPUs not in MIG mode."""
    usable = [g for g in gpus if g.row.healthy and not g.mig_mode]
    return (sum(1 for g in usable if g.milli == 0),
            sum(MILLI_PER_GPU - g.milli for g in usable) / MILLI_PER_GPU)


def _fragmentation(ready: list[list[_Gpu]]) -> dict:
    free_total = stranded = 0.0
    weight = 1.0 / len(WHOLE_SHAPES)
    for gpus in ready:
        full, free = _whole_capacity(gpus)
        free_total += free
        stranded += sum(weight * (free - (full if full >= k else 0)) for k in WHOLE_SHAPES)
    return {"figure": round(stranded / free_total, 4) if free_total else 0.0, "free_gpus": round(free_total, 4),
            "stranded_gpus": round(stranded, 4), "shapes_gpus": list(WHOLE_SHAPES), "explain": FRAGMENTATION_EXPLAIN}


def mig_fits(profile: MigProfile, used_mask: int) -> int:
    """How many instances of ``profile`` fit one after another on a GPU whose memory slices ``used_mask``
    holds (the lowest free start first, as NVIDIA's placement table lists them)."""
    count = 0
    for start in profile.starts:
        mask = profile.mask_at(start)
        if not used_mask & mask:
            used_mask |= mask
            count += 1
    return count


def _fits(ready: list[list[_Gpu]], families: dict[tuple[str, int], str | None]) -> list[dict]:
    full = [_whole_capacity(gpus)[0] for gpus in ready]
    out: list[dict] = [{"shape": f"{k} GPU" + ("s" if k > 1 else ""), "gpus": k, "count": sum(f // k for f in full)}
                       for k in WHOLE_SHAPES]
    for name in MIG_SHAPES:
        count = 0
        for gpus in ready:
            for g in gpus:
                family = families.get((g.row.model, g.row.memory_mib))
                profile = MIG_FAMILIES[family].get(name) if family is not None else None
                if profile is not None and g.mig_mode and g.row.healthy:
                    count += mig_fits(profile, g.mig_used)
        out.append({"shape": name, "mig_profile": name, "count": count})
    return out
