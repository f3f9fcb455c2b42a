"""The openb pods as timed jobs (creation, lifetime, QoS -> priority) and the cluster they run on.

Priorities: ``LS`` and ``Guaranteed`` are high (100), ``Burstable`` middle (50), ``BE`` low (0). A
pod's work is its lifetime in the trace (``deletion_time - creation_time``, at least 1 s): the
trace's own queueing before ``scheduled_time`` is small (median 2 s) and is what we re-simulate.

The openb trace is light for its 1213-node cluster (at most ~66 GPUs requested at once), so the
replay runs on a proportional sample of its nodes: nodes sorted by (GPU count, model, CPU, memory,
name), then every k-th, with k chosen so the sample holds at least ``target_gpus`` GPUs (the mix of
node shapes and the CPU per GPU stay close to the full cluster's). Pods that could not run even on
the empty sample are left out and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpusched_core.placement import Node, PodRequest, build_snapshot, feasible_mask

from ..traces.openb import load_nodes, read_pod_rows

PRIORITY_BY_QOS = {"LS": 100, "Guaranteed": 100, "Burstable": 50, "BE": 0}
CLASS_BY_PRIORITY = {100: "high", 50: "middle", 0: "low"}
HIGH_PRIORITY = 100


@dataclass(frozen=True, slots=True)
class SimPod:
    """One pod of the trace: its request, GPU milli, QoS and priority, arrival and work (seconds)."""

    request: PodRequest
    gpu_milli: int
    qos: str
    priority: int
    created_s: float
    work_s: float

    @property
    def pod_id(self) -> str:
        return str(self.request.id)

    @property
    def high(self) -> bool:
        return self.priority >= HIGH_PRIORITY

    @property
    def priority_class(self) -> str:
        return CLASS_BY_PRIORITY.get(self.priority, str(self.priority))


def load_timed_pods(path: Path) -> list[SimPod]:
    """Pods of an openb pod list with times, sorted by (creation time, name)."""
    pods = []
    for pod, life in read_pod_rows(path):
        if life is None:
            raise ValueError(f"{path}: pod {pod.request.id} has no creation and deletion time")
        work = max(1.0, life.deleted_s - life.created_s)
        pods.append(SimPod(pod.request, pod.gpu_milli, life.qos, PRIORITY_BY_QOS.get(life.qos, 0), life.created_s,
                           work))  # fmt: skip
    pods.sort(key=lambda pod: (pod.created_s, pod.pod_id))
    return pods


def sample_nodes(nodes: Sequence[Node], target_gpus: int) -> list[Node]:
    """Every k-th node of the shape-sorted list, the fewest that hold at least ``target_gpus`` GPUs."""
    ordered = sorted(nodes, key=lambda n: (-len(n.gpus), n.gpus[0].model if n.gpus else "", n.cpu_milli,
                                           n.memory_mib, n.id))  # fmt: skip
    if target_gpus <= 0 or sum(len(n.gpus) for n in ordered) <= target_gpus:
        return list(ordered)
    for count in range(1, len(ordered) + 1):
        step = len(ordered) / count
        picked = [ordered[int((i + 0.5) * step)] for i in range(count)]
        if sum(len(n.gpus) for n in picked) >= target_gpus:
            return picked
    return list(ordered)


def load_cluster(path: Path, target_gpus: int) -> list[Node]:
    return sample_nodes(load_nodes(path), target_gpus)


def demand_quantile_gpus(pods: Sequence[SimPod], window: tuple[float, float], quantile: float) -> float:
    """The ``quantile`` of GPUs requested by the pods alive at once (time-weighted over ``window``),
    if every pod ran from its creation for its work time."""
    changes = sorted([(p.created_s, p.gpu_milli) for p in pods]
                     + [(p.created_s + p.work_s, -p.gpu_milli) for p in pods])  # fmt: skip
    low, high = window
    level, last, spans = 0, low, []
    for at_s, delta in changes:
        if at_s > last and last < high:
            spans.append((level, min(at_s, high) - last))
        level, last = level + delta, max(last, at_s)
    if last < high:
        spans.append((level, high - last))
    spans.sort()
    total, seen = sum(length for _, length in spans), 0.0
    for level_milli, length in spans:
        seen += length
        if seen >= quantile * total:
            return level_milli / 1000.0
    return spans[-1][0] / 1000.0 if spans else 0.0


def runnable(nodes: Sequence[Node], pods: Sequence[SimPod]) -> tuple[list[SimPod], list[SimPod]]:
    """(pods that fit on the empty cluster, pods that never could)."""
    empty = build_snapshot(nodes)
    fits, never = [], []
    for pod in pods:
        (fits if feasible_mask(empty, pod.request).any() else never).append(pod)
    return fits, never
