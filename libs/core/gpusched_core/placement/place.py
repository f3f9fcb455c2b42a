"""``place``: one request, one snapshot, one policy -> one ``Decision`` with its reasons.

Choosing a node: filter (``feasibility``), score (the policy), take the highest score. Ties go to
the first node in snapshot order (first fit among equals, which packs; the FGD artifact's scheduler
does the same over its seeded node order), or, with ``tie_break_seed``, to the smallest seeded hash
of (request id, node position), which spreads equal nodes evenly. Either way the same inputs always
give the same node.

Gangs: members go to distinct nodes, all or nothing. When one topology domain (node label
``gang.topology_key``) has enough feasible nodes, the gang stays inside the tightest such domain;
members are bound one at a time on a scratch snapshot, which is simply dropped if the gang fails.
"""

from __future__ import annotations

import numpy as np

from . import kernel, tiebreak
from .devices import bind
from .feasibility import explain, feasible_mask
from .model import Binding, Decision, GangRequest, GpuShare, MigSlice, NodeClassReason, PodRequest, RequestId, WholeGpus
from .policies import Candidates, PlacementPolicy
from .snapshot import ClusterSnapshot, apply_bindings


def _unplaced(request_id: RequestId, policy: PlacementPolicy, failures: tuple[NodeClassReason, ...],
              lead: str) -> Decision:  # fmt: skip
    reasons = (lead, *(str(f) for f in failures))
    return Decision(request_id, policy.name, False, reasons=reasons, unplaced_by_class=failures)


def _choose(
    snapshot: ClusterSnapshot,
    request: PodRequest,
    policy: PlacementPolicy,
    allowed: np.ndarray | None,
    tie_break_seed: int | None,
) -> tuple[Binding, str, float] | None:
    salt = None if tie_break_seed is None else tiebreak.salt_for(request.id, tie_break_seed)
    rule = "node order" if tie_break_seed is None else "seeded hash"
    fast = getattr(policy, "fast", None)
    if fast is not None and fast(request):  # the memoised policies, in one kernel call
        extra = allowed
        if request.node_selector:
            selected = snapshot.layout.selector_mask(request.node_selector)
            extra = selected if extra is None else extra & selected
        choice = policy.choose(snapshot, request, extra, salt)  # type: ignore[attr-defined]
        if choice is None:
            return None
        if choice is not kernel.UNSUPPORTED:
            binding = bind(snapshot, request, choice.row, choice.share_gpu)
            return binding, _why(policy, policy.meaning, choice.value, binding, choice.feasible, choice.ties,
                                 rule), choice.value  # fmt: skip
    mask = feasible_mask(snapshot, request)
    if allowed is not None:
        mask &= allowed
    nodes = mask.nonzero()[0]
    if nodes.size == 0:
        return None
    candidates = Candidates(snapshot, request, nodes)
    scores = policy.score(candidates)
    position, ties = tiebreak.pick_best(scores.values, nodes, salt)
    share = None if scores.share_gpu is None else int(scores.share_gpu[position])
    row = int(nodes[position])
    binding = bind(snapshot, request, row, share)
    value = float(scores.values[position])
    return binding, _why(policy, scores.meaning, value, binding, nodes.size, ties, rule), value


def _why(policy: PlacementPolicy, meaning: str, value: float, binding: Binding, feasible: int, ties: int,
         rule: str) -> str:  # fmt: skip
    tied = f"; {ties} tied, broken by {rule}" if ties > 1 else ""
    return f"policy {policy.name}: {meaning} {value:g} on {binding.node_id}, best of {feasible} feasible nodes{tied}"


def place(
    snapshot: ClusterSnapshot,
    request: PodRequest | GangRequest,
    policy: PlacementPolicy,
    *,
    tie_break_seed: int | None = None,
) -> Decision:
    """Decide where ``request`` goes on ``snapshot`` under ``policy`` (nothing is applied)."""
    if isinstance(request, GangRequest):
        return place_gang(snapshot, request, policy, tie_break_seed=tie_break_seed)
    chosen = _choose(snapshot, request, policy, None, tie_break_seed)
    if chosen is None:
        failures = explain(snapshot, request)
        return _unplaced(request.id, policy, failures, f"no node fits {describe(request)}")
    binding, why, value = chosen
    return Decision(request.id, policy.name, True, (binding,), reasons=(why,), score=value)


def describe(request: PodRequest) -> str:
    """A short human description of what a request asks for."""
    gpu = request.gpu
    parts = []
    if isinstance(gpu, WholeGpus):
        parts.append(f"{gpu.count} whole GPU{'s' if gpu.count > 1 else ''}")
    elif isinstance(gpu, GpuShare):
        memory = f" and {gpu.memory_mib} MiB" if gpu.memory_mib else ""
        parts.append(f"{gpu.milli} milli{memory} of one GPU")
    elif isinstance(gpu, MigSlice):
        parts.append(f"MIG {gpu.profile}")
    if request.allowed_models:
        parts.append("of " + "|".join(sorted(request.allowed_models)))
    parts.append(f"with {request.cpu_milli} CPU milli, {request.memory_mib} MiB")
    return " ".join(parts)


def _domain_plan(snapshot: ClusterSnapshot, gang: GangRequest) -> tuple[np.ndarray | None, str]:
    """Nodes the gang may use: the tightest topology domain with enough feasible nodes, else all."""
    feasible = feasible_mask(snapshot, gang.member(0))
    codes = snapshot.layout.label_values(gang.topology_key)
    labelled = feasible & (codes >= 0)
    if labelled.any():
        counts = np.bincount(codes[labelled])
        fitting = np.flatnonzero(counts >= gang.node_count)
        if fitting.size:
            tightest = fitting[np.argmin(counts[fitting])]  # fewest feasible nodes, then lowest code
            value = next(n.labels[gang.topology_key] for n, c in zip(snapshot.nodes, codes, strict=True)
                         if c == tightest)  # fmt: skip
            return codes == tightest, f"gang kept in {gang.topology_key}={value}"
    return None, f"no single {gang.topology_key} domain fits the gang; spread over the cluster"


def place_gang(
    snapshot: ClusterSnapshot, gang: GangRequest, policy: PlacementPolicy, *, tie_break_seed: int | None = None
) -> Decision:
    """All ``gang.node_count`` members on distinct nodes, or nothing (with per-class reasons)."""
    allowed, domain_note = _domain_plan(snapshot, gang)
    scratch = snapshot
    used = np.zeros(snapshot.layout.node_count, dtype=bool)
    bindings: list[Binding] = []
    reasons = [domain_note]
    scores: list[float] = []
    for ordinal in range(gang.node_count):
        member = gang.member(ordinal)
        member_allowed = ~used if allowed is None else allowed & ~used
        chosen = _choose(scratch, member, policy, member_allowed, tie_break_seed)
        if chosen is None:
            failures = explain(scratch, member, excluded=used)
            lead = f"gang {gang.id}: only {ordinal} of {gang.node_count} members fit; nothing bound"
            return _unplaced(gang.id, policy, failures, lead)
        binding, why, value = chosen
        bindings.append(binding)
        reasons.append(f"member {ordinal}: {why}")
        scores.append(value)
        used[scratch.node_index(binding.node_id)] = True
        scratch = apply_bindings(scratch, member.id, (binding,))
    return Decision(gang.id, policy.name, True, tuple(bindings), tuple(reasons), score=float(np.mean(scores)))
