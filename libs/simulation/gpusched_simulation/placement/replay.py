"""Replaying a trace under the published FGD protocol.

Per seed: nodes permuted, pods (sorted by name) shuffled, then inflated with pods drawn uniformly
with replacement until the next one would push requested GPU above ``inflation`` x capacity. No
departures, queue or retries: each pod is placed once or fails for good. Failed pods still count as
arrived. All randomness comes from ``numpy.random.default_rng(seed)`` here and from the engine's
seeded tie-breaking, so a (trace, policy, seed) run is reproducible bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpusched_core.placement import (
    Node,
    PodRequest,
    RequestId,
    WorkloadDistribution,
    apply,
    build_snapshot,
    cluster_fragmentation,
    make_policy,
    place,
)

from ..traces.openb import TracePod
from .metrics import FRAGMENTATION_CHECKPOINTS, arrived_pct_rounded

INFLATION = 1.3
TYPICAL_POPULARITY = 0.95
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RunLog:
    """Per-pod series of one run (milli) and fragmentation at checkpoints (% of capacity)."""

    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: np.ndarray
    allocated_milli: np.ndarray
    fragmentation_pct: dict[int, float]
    placed: int
    failed: int


def arrival_order(pods: Sequence[TracePod], capacity_milli: int, seed: int,
                  inflation: float = INFLATION) -> list[TracePod]:  # fmt: skip
    """Shuffled pods followed by inflation draws (named ``<pod>-tuned-<i>``).

    A pod list that already asks for more than the target loses random pods instead, as in the
    artifact's tuning step.
    """
    rng = np.random.default_rng(seed)
    order = [pods[i] for i in rng.permutation(len(pods))]
    requested = sum(pod.gpu_milli for pod in pods)
    target = inflation * capacity_milli
    while requested > target and order:
        requested -= order.pop(int(rng.integers(len(order)))).gpu_milli
    draw = 0
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        if requested + pod.gpu_milli > target:
            break
        request = pod.request
        clone = PodRequest(RequestId(f"{request.id}-tuned-{draw}"), request.gpu, request.cpu_milli,
                           request.memory_mib, request.allowed_models)  # fmt: skip
        order.append(TracePod(clone, pod.gpu_milli))
        requested += pod.gpu_milli
        draw += 1
    return order


def permuted_nodes(nodes: Sequence[Node], seed: int) -> list[Node]:
    rng = np.random.default_rng([seed, 1])
    return [nodes[i] for i in rng.permutation(len(nodes))]


def replay(
    nodes: Sequence[Node],
    pods: Sequence[TracePod],
    policy_name: str,
    seed: int,
    workload: WorkloadDistribution,
    progress: Progress | None = None,
    hashed_ties: bool = False,
) -> RunLog:
    """One run of ``policy_name`` with ``seed`` over the trace.

    Ties go to the first node in the seed's node order (the artifact's deterministic scheduler),
    or, with ``hashed_ties``, to a seeded hash per pod.
    """
    tie_break_seed = seed if hashed_ties else None
    snapshot = build_snapshot(permuted_nodes(nodes, seed))
    capacity = snapshot.gpu_milli_capacity
    order = arrival_order(pods, capacity, seed)
    policy = make_policy(policy_name, seed=seed, workload=workload)
    typical = workload.most_popular(TYPICAL_POPULARITY)  # what the published fragmentation is measured on
    arrived = np.zeros(len(order), dtype=np.int64)
    allocated = np.zeros(len(order), dtype=np.int64)
    pending = sorted(FRAGMENTATION_CHECKPOINTS)
    fragmentation: dict[int, float] = {}
    total_arrived = total_allocated = placed = 0
    for i, pod in enumerate(order):
        total_arrived += pod.gpu_milli
        decision = place(snapshot, pod.request, policy, tie_break_seed=tie_break_seed)
        if decision.placed:
            snapshot = apply(snapshot, decision)
            total_allocated += pod.gpu_milli
            placed += 1
        arrived[i], allocated[i] = total_arrived, total_allocated
        while pending and arrived_pct_rounded(total_arrived, capacity) >= pending[0]:
            fragmentation[pending.pop(0)] = cluster_fragmentation(snapshot, typical).fragmentation_pct
        if progress is not None and i % 500 == 0:
            progress(i, len(order))
    if progress is not None:
        progress(len(order), len(order))
    return RunLog(policy_name, seed, capacity, arrived, allocated, fragmentation, placed, len(order) - placed)
