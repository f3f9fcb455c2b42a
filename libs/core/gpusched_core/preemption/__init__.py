"""Victim selection: the pure core of the preemption service (no I/O, clock, randomness).

Typical use, once per blocked job (time and ids are arguments)::

    from gpusched_core import preemption as sel

    plan = sel.select_victims(
        snapshot,                       # the placement engine's ClusterSnapshot (reservations included)
        sel.Preemptor(job_id, tenant, priority, request, units),   # request: PodRequest | GangRequest
        running,                        # list[sel.RunningJob]: who holds which allocation ids
        now_s,
        trigger=sel.PriorityTrigger(),  # or sel.ReclaimRequest(...), sel.FairShareTrigger(...)
        quota={tenant: sel.TenantQuota(nominal_units, used_units), ...},
        config=sel.SelectionConfig(min_runtime_s={"batch": 600}),
    )
    match plan.outcome:
        case "preempt":  # PreemptionRequested per victim (victim.reason) + the preemptor's plan.reasons;
                         # hold plan.placement as the preemptor's reserved slot
            snapshot = sel.reserve(snapshot, plan)
        case "await":    # victims already stopping will free enough: keep waiting, preempt nothing
            snapshot = sel.reserve(snapshot, plan)
        case "fits":     # place it (placement is the engine's decision)
            ...
        case "none":     # record plan.reasons on the preemptor ("why is my job pending")
            ...

For a quota reclaim request, ``plan_reclaim(snapshot, preemptor, sel.ReclaimAsk(...), running, freed,
now_s)`` adds the flavor, the quota the victims must give back and stale or repeated requests on top of
``select_victims`` (see ``reclaim``).

Guarantees: victims are never protected (minimum run time per priority class), never of equal or
higher priority for a priority trigger, and come only from borrowers for a reclaim; gangs go whole;
releasing the victims lets the preemptor be placed (verified with the placement engine on a copy of
the snapshot); the victim count is the fewest (per node exact search, ``plan.exact``); among equally
few, the ``VictimOrder`` (default: borrowed usage, lower priority, less work lost since the last
checkpoint, younger, job id) decides; the same inputs always give the same plan.
"""

from .eligibility import Eligibility, TenantLimit, classify, held_gpu_milli, lost_work_s
from .model import (
    FairShareTrigger,
    Outcome,
    PreemptionPlan,
    Preemptor,
    PriorityTrigger,
    ReclaimRequest,
    RunningJob,
    SelectionConfig,
    TenantQuota,
    Trigger,
    Victim,
)
from .nodeview import released
from .ordering import (
    VICTIM_ORDERS,
    CandidateFacts,
    DefaultVictimOrder,
    LeastLostWorkOrder,
    VictimOrder,
    set_cost,
    victim_order,
)
from .reasons import format_duration
from .reclaim import FreedFor, ReclaimAsk, of_flavor, plan_reclaim, quota_need_units, top_up
from .select import nobody_to_preempt, reserve, select_victims

__all__ = [
    "VICTIM_ORDERS",
    "CandidateFacts", "DefaultVictimOrder", "Eligibility", "FairShareTrigger", "FreedFor", "LeastLostWorkOrder",
    "Outcome", "PreemptionPlan", "Preemptor", "PriorityTrigger", "ReclaimAsk", "ReclaimRequest", "RunningJob",
    "SelectionConfig", "TenantLimit", "TenantQuota", "Trigger", "Victim", "VictimOrder",
    "classify", "format_duration", "held_gpu_milli", "lost_work_s", "nobody_to_preempt", "of_flavor", "plan_reclaim", "quota_need_units",
    "released", "reserve", "select_victims", "set_cost", "top_up", "victim_order",
]  # fmt: skip
