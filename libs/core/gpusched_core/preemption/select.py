"""``select_victims``: one preemptor, one snapshot, the running jobs -> a ``PreemptionPlan``.

Steps: (1) if the preemptor fits now, say so; (2) classify running jobs for the trigger; (3) if jobs
already being preempted free enough, wait for them (no new victims: no preemption cascades); (4)
search the fewest, cheapest victims (``search``); (5) verify with the placement engine on a copy of
the snapshot with the victims released, so the freed GPUs are usable by this request (node, model,
MIG slice positions); the verified decision is the slot to reserve. Nothing is preempted unless (5)
places the preemptor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpusched_core.placement import (
    ClusterSnapshot,
    Decision,
    GangRequest,
    PlacementPolicy,
    apply,
    explain,
    make_policy,
    place,
)

from . import reasons as text
from .eligibility import Eligibility, classify
from .gang import gang_options
from .model import (
    FairShareTrigger,
    PreemptionPlan,
    Preemptor,
    PriorityTrigger,
    RunningJob,
    SelectionConfig,
    TenantQuota,
    Trigger,
    Victim,
)
from .nodeview import NodeView, allocations_by_node, could_fit, footprint, free_on_node, released
from .ordering import CandidateFacts, VictimOrder, victim_order
from .search import NodeOption, prune, search_node

DEFAULT_CONFIG = SelectionConfig()


@dataclass(frozen=True)
class _Context:
    snapshot: ClusterSnapshot
    preemptor: Preemptor
    trigger: Trigger
    eligibility: Eligibility
    config: SelectionConfig
    policy: PlacementPolicy
    order: VictimOrder

    @property
    def awaited_ids(self) -> tuple[str, ...]:
        return tuple(a for job in self.eligibility.awaiting for a in job.allocation_ids)


def _victim_ids(victims: Iterable[CandidateFacts]) -> list[str]:
    return [a for facts in victims for a in facts.job.allocation_ids]


def _verify(ctx: _Context, victims: Sequence[CandidateFacts]) -> Decision:
    return place(released(ctx.snapshot, [*ctx.awaited_ids, *_victim_ids(victims)]), ctx.preemptor.request, ctx.policy)


def _pod_options(ctx: _Context) -> tuple[list[NodeOption], bool]:
    """Each node's cheapest option, best first, and whether every node was searched exactly."""
    request = ctx.preemptor.request
    assert not isinstance(request, GangRequest)
    by_node = allocations_by_node(ctx.snapshot)
    on_node: dict[int, list[CandidateFacts]] = {}
    for facts in ctx.eligibility.candidates:
        for node_id in _nodes_of(ctx.snapshot, facts.job.allocation_ids):
            on_node.setdefault(ctx.snapshot.node_index(node_id), []).append(facts)
    awaited = set(ctx.awaited_ids)
    options, exact = [], True
    for row in sorted(on_node):
        allocations = by_node.get(ctx.snapshot.nodes[row].id, {})
        base = tuple(a for a in sorted(allocations) if a in awaited)
        movable = [*base, *_victim_ids(on_node[row])]
        upper = free_on_node(ctx.snapshot, row)
        for allocation_id in dict.fromkeys(movable):
            upper = upper + footprint(allocations.get(allocation_id, ()))
        if not could_fit(request, upper):
            continue  # even releasing every candidate here leaves too little in total
        view = NodeView(ctx.snapshot, row, allocations, movable)
        option = search_node(view, request, on_node[row], base, ctx.eligibility, ctx.config)
        exact &= not view.capped
        if option is not None:
            options.append(option)
    return sorted(options, key=lambda o: o.rank), exact


def _nodes_of(snapshot: ClusterSnapshot, allocation_ids: Iterable[str]) -> list[str]:
    nodes = (b.node_id for a in allocation_ids for b in snapshot.allocations.get(a, ()))  # type: ignore[call-overload]
    return list(dict.fromkeys(nodes))


def _search(ctx: _Context) -> tuple[tuple[CandidateFacts, ...], Decision, bool, int] | None:
    """(victims, verified placement, exact, options considered), or None when nothing works."""
    if isinstance(ctx.preemptor.request, GangRequest):
        return _search_gang(ctx)
    options, exact = _pod_options(ctx)
    for option in options:
        decision = _verify(ctx, option.victims)
        if decision.placed:
            return option.victims, decision, exact, len(options)
    return None


def _search_gang(ctx: _Context) -> tuple[tuple[CandidateFacts, ...], Decision, bool, int] | None:
    gang = ctx.preemptor.request
    assert isinstance(gang, GangRequest)
    found = gang_options(ctx.snapshot, gang, ctx.eligibility, ctx.config, ctx.awaited_ids)
    if found is None:
        return None
    victims, exact, considered = found
    decision = _verify(ctx, victims)
    if not decision.placed:
        return None
    keys = ctx.eligibility.keys
    ordered = sorted(victims, key=lambda v: keys[v.job.job_id])
    kept = prune(range(len(ordered)), lambda chosen: _verify(ctx, [ordered[i] for i in chosen]).placed)
    final = tuple(ordered[i] for i in kept)
    return final, _verify(ctx, final), exact and len(kept) == len(ordered), considered


def select_victims(
    snapshot: ClusterSnapshot,
    preemptor: Preemptor,
    running: Sequence[RunningJob],
    now_s: float,
    *,
    trigger: Trigger = PriorityTrigger(),
    quota: Mapping[str, TenantQuota] | None = None,
    config: SelectionConfig = DEFAULT_CONFIG,
    policy: PlacementPolicy | None = None,
) -> PreemptionPlan:
    """Decide whom to preempt so that ``preemptor`` runs, or why no one (see ``PreemptionPlan``).

    ``snapshot`` holds every allocation, including slots already reserved for earlier preemptors;
    ``running`` lists the jobs behind those allocations; ``policy`` (default ``bestfit``) places the
    preemptor on the what-if copies. Pure: the same arguments always give the same plan.
    """
    chosen_policy = policy or make_policy("bestfit")
    request = preemptor.request
    now = place(snapshot, request, chosen_policy)
    if now.placed:
        return PreemptionPlan(preemptor.job_id, trigger.kind, "fits", placement=now,
                              reasons=("fits without preemption", *now.reasons))  # fmt: skip
    lead = f"{text.trigger_lead(preemptor, trigger)} cannot be placed ({now.reasons[0] if now.reasons else ''})"
    if isinstance(trigger, FairShareTrigger) and not config.fair_share_enabled:
        disabled = (lead, "fair-share preemption is disabled")
        return PreemptionPlan(preemptor.job_id, trigger.kind, "none", reasons=disabled)
    order = victim_order(config.victim_order)
    eligibility = classify(snapshot, preemptor, running, now_s, trigger, quota or {}, config, order)
    return _decide(_Context(snapshot, preemptor, trigger, eligibility, config, chosen_policy, order), lead)


def nobody_to_preempt(preemptor: Preemptor, running: int, lowest_priority: int | None,
                      stopping: int) -> PreemptionPlan | None:  # fmt: skip
    """The plan of a priority preemption decided from the running jobs' priorities alone, without the cluster:
    ``none`` when no job is being preempted (nothing to await) and none of the ``running`` jobs has a lower
    priority than the preemptor (``lowest_priority``: the lowest of theirs), for then each is excluded as of
    equal or higher priority whatever the cluster holds; None when only ``select_victims`` can tell."""
    if stopping or (lowest_priority is not None and lowest_priority < preemptor.priority):
        return None
    lead = f"{text.trigger_lead(preemptor, PriorityTrigger())} waits for GPUs"
    excluded = (("of equal or higher priority", running),) if running else ()
    return PreemptionPlan(preemptor.job_id, "priority", "none",
                          reasons=(lead, "no running job may be preempted for it", text.excluded_text(excluded)))


def _decide(ctx: _Context, lead: str) -> PreemptionPlan:
    """Await jobs already stopping, else search victims, else say why nothing helps."""
    job_id, kind, eligibility = ctx.preemptor.job_id, ctx.trigger.kind, ctx.eligibility
    if eligibility.awaiting:
        waited = _verify(ctx, ())
        if waited.placed:
            ids = tuple(job.job_id for job in eligibility.awaiting)
            why = f"fits once jobs already being preempted stop ({', '.join(ids)}); no new victims"
            return PreemptionPlan(job_id, kind, "await", awaiting=ids, awaiting_allocation_ids=ctx.awaited_ids,
                                  placement=waited, reasons=(lead, why, *waited.reasons))  # fmt: skip
    everything = released(ctx.snapshot, [*ctx.awaited_ids, *_victim_ids(eligibility.candidates)])
    if not eligibility.candidates or not place(everything, ctx.preemptor.request, ctx.policy).placed:
        return PreemptionPlan(job_id, kind, "none", reasons=_why_none(ctx, lead, everything))
    found = _search(ctx)
    if found is None:
        why = "no preemption: every set of victims that would make room breaks a tenant's borrowing or share limit"
        return PreemptionPlan(job_id, kind, "none", reasons=(lead, why, text.excluded_text(eligibility.excluded)))
    return _plan(ctx, lead, *found)


def _why_none(ctx: _Context, lead: str, everything: ClusterSnapshot) -> tuple[str, ...]:
    candidates = ctx.eligibility.candidates
    excluded = text.excluded_text(ctx.eligibility.excluded)
    if not candidates:
        return (lead, "no running job may be preempted for it", excluded)
    request = ctx.preemptor.request
    member = request.member(0) if isinstance(request, GangRequest) else request
    still = "; ".join(str(r) for r in explain(everything, member)) or "a gang needs more nodes than that frees"
    noun = "candidate" if len(candidates) == 1 else "candidates"
    return (lead, f"no preemption: even releasing all {len(candidates)} {noun} would not let it run ({still})",
            excluded)  # fmt: skip


def _plan(ctx: _Context, lead: str, victims: tuple[CandidateFacts, ...], decision: Decision, exact: bool,
          considered: int) -> PreemptionPlan:  # fmt: skip
    preemptor, trigger = ctx.preemptor, ctx.trigger
    out = tuple(Victim(f.job.job_id, f.job.tenant, f.job.priority, f.job.allocation_ids, f.gpu_milli, f.lost_work_s,
                       text.victim_reason(f, preemptor, trigger)) for f in victims)  # fmt: skip
    nodes = _nodes_of(ctx.snapshot, _victim_ids(victims))
    proof = "the proven minimum" if exact else "minimal (no victim can be spared; search cap reached)"
    count = f"{len(victims)} victim{'s' if len(victims) != 1 else ''}"
    reasons = (
        lead,
        text.plan_text(victims, nodes, preemptor),
        f"fewest victims: {count}, {proof}; {considered} placement option(s) considered, "
        f"{len(ctx.eligibility.candidates)} candidate(s); {text.excluded_text(ctx.eligibility.excluded)}",
        text.order_text(ctx.order),
        *(f"reserved slot: {r}" for r in decision.reasons),
    )
    awaiting = tuple(job.job_id for job in ctx.eligibility.awaiting)
    return PreemptionPlan(preemptor.job_id, trigger.kind, "preempt", out, awaiting, ctx.awaited_ids, decision,
                          reasons, exact)  # fmt: skip


def reserve(snapshot: ClusterSnapshot, plan: PreemptionPlan) -> ClusterSnapshot:
    """The snapshot once ``plan`` is carried out: the victims' and awaited jobs' allocations released,
    and the preemptor's slot held under its request id (unchanged for ``none``).

    Use it as the working snapshot for the next preemptor of the same cycle, so that two preemptors
    never count on the same freed GPUs; the live service holds the reservation until the preemptor
    is placed.
    """
    if plan.placement is None or plan.outcome == "none":
        return snapshot
    ids = [a for v in plan.victims for a in v.allocation_ids] + list(plan.awaiting_allocation_ids)
    return apply(released(snapshot, ids), plan.placement)
