"""The pure placement core: snapshot in, decision (with reasons) out. No I/O, clock or global random.

Typical use::

    from gpusched_core import placement as engine

    snapshot = engine.build_snapshot(nodes)                      # nodes: list[engine.Node]
    policy = engine.make_policy("bestfit")                        # or "fgd", "ours", ...
    decision = engine.place(snapshot, request, policy)            # request: PodRequest | GangRequest
    if decision.placed:
        snapshot = engine.apply(snapshot, decision)               # a new snapshot; the old one is intact
    ...
    snapshot = engine.release(snapshot, decision.request_id)

    # the simplest case: N whole GPUs of an allowed model on one node
    decision = engine.place_whole_gpus(snapshot, "job-1", 4, allowed_models={"H100-80GB"})

Every ``Decision`` names the policy, the chosen node(s) and GPUs (``bindings``) and why; one that
places nothing lists, per class of node, the first check those nodes failed (``unplaced_by_class``).
``cluster_fragmentation(snapshot, workload)`` measures fragmentation against a workload's request
distribution (``workload_from_requests``), the quantity FGD and our policy minimise.
"""

from __future__ import annotations

from collections.abc import Iterable

from .feasibility import explain, feasible_mask
from .fragmentation import (
    FragmentationReport,
    RequestShape,
    WorkloadDistribution,
    cluster_fragmentation,
    node_fragmentation,
    shape_of,
    workload_from_requests,
)
from .mig import MIG_FAMILIES, MigProfile, mig_family, mig_profile
from .model import (
    DEFAULT_TOPOLOGY_KEY,
    MILLI_PER_GPU,
    MODEL_LABEL,
    Binding,
    Decision,
    GangRequest,
    Gpu,
    GpuAsk,
    GpuShare,
    MigPlacement,
    MigSlice,
    Node,
    NodeClassReason,
    NodeId,
    PlacementError,
    PodRequest,
    RequestId,
    WholeGpus,
)
from .place import describe, place, place_gang
from .policies import Candidates, NodeScores, PlacementPolicy
from .registry import PolicyInfo, default_workload, make_policy, policy_infos, policy_names
from .snapshot import (
    ClusterLayout,
    ClusterSnapshot,
    apply,
    apply_bindings,
    apply_many,
    build_snapshot,
    rebuild,
    release,
    with_gpu_state,
)


def place_whole_gpus(
    snapshot: ClusterSnapshot,
    request_id: str,
    count: int,
    *,
    allowed_models: Iterable[str] = (),
    cpu_milli: int = 0,
    memory_mib: int = 0,
    policy: PlacementPolicy | str = "bestfit",
    tie_break_seed: int | None = None,
) -> Decision:
    """``count`` whole GPUs of one of ``allowed_models`` (any model when empty) on one node."""
    request = PodRequest(
        id=RequestId(request_id),
        gpu=WholeGpus(count),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        allowed_models=frozenset(allowed_models),
    )
    chosen = make_policy(policy) if isinstance(policy, str) else policy
    return place(snapshot, request, chosen, tie_break_seed=tie_break_seed)


__all__ = [
    "DEFAULT_TOPOLOGY_KEY", "MIG_FAMILIES", "MILLI_PER_GPU", "MODEL_LABEL",
    "Binding", "Candidates", "ClusterLayout", "ClusterSnapshot", "Decision", "FragmentationReport",
    "GangRequest", "Gpu", "GpuAsk", "GpuShare", "MigPlacement", "MigProfile", "MigSlice", "Node",
    "NodeClassReason", "NodeId", "NodeScores", "PlacementError", "PlacementPolicy", "PodRequest",
    "PolicyInfo", "RequestId", "RequestShape", "WholeGpus", "WorkloadDistribution",
    "apply", "apply_bindings", "apply_many", "build_snapshot", "cluster_fragmentation", "default_workload", "describe",
    "explain", "feasible_mask", "make_policy", "mig_family", "mig_profile", "node_fragmentation", "place",
    "place_gang", "place_whole_gpus", "policy_infos", "policy_names", "rebuild", "release", "shape_of",
    "with_gpu_state", "workload_from_requests",
]  # fmt: skip
