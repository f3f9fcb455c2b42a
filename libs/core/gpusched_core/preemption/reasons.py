"""The words of a preemption decision: what the victim is told and what the preemptor's record says."""

from __future__ import annotations

from collections.abc import Sequence

from gpusched_core.placement import GangRequest, PodRequest, describe

from .model import FairShareTrigger, Preemptor, ReclaimRequest, Trigger
from .ordering import CandidateFacts, VictimOrder


def format_duration(seconds: float) -> str:
    """``45 s``, ``4 min``, ``2.5 h``, ``3.1 d``: short, rounded, for people."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def describe_request(request: PodRequest | GangRequest) -> str:
    if isinstance(request, GangRequest):
        return f"a gang of {request.node_count} x {request.gpus_per_node} GPUs"
    return describe(request)


def _lost_text(facts: CandidateFacts) -> str:
    checkpointed = facts.job.last_checkpoint_at_s is not None
    since = "since last checkpoint" if checkpointed else "since it started (no checkpoint)"
    return f"lost {format_duration(facts.lost_work_s)} {since}"


def victim_reason(facts: CandidateFacts, preemptor: Preemptor, trigger: Trigger) -> str:
    """What the victim's record says, e.g. ``preempted for job X of priority 100 in tenant T; lost 4
    min since last checkpoint``, or for a reclaim ``preempted to return borrowed A100-80GB capacity to
    tenant T (under its nominal quota) for its job X: tenant B borrowed it; lost ...``."""
    if isinstance(trigger, ReclaimRequest):
        what = f"borrowed {trigger.flavor} capacity" if trigger.flavor else "borrowed capacity"
        return (f"preempted to return {what} to tenant {trigger.tenant} (under its nominal quota) for its job "
                f"{preemptor.job_id}: tenant {facts.job.tenant} borrowed it; {_lost_text(facts)}")
    lead = f"preempted for job {preemptor.job_id} of priority {preemptor.priority} in tenant {preemptor.tenant}"
    if isinstance(trigger, FairShareTrigger):
        lead += f", because tenant {facts.job.tenant} is above its fair share"
    return f"{lead}; {_lost_text(facts)}"


def victim_summary(facts: CandidateFacts) -> str:
    job = facts.job
    borrowed = ", borrowed" if facts.borrowing else ""
    return f"{job.job_id} (tenant {job.tenant}, priority {job.priority}{borrowed}, {_lost_text(facts)})"


def trigger_lead(preemptor: Preemptor, trigger: Trigger) -> str:
    who = f"job {preemptor.job_id} (priority {preemptor.priority}, tenant {preemptor.tenant})"
    if isinstance(trigger, ReclaimRequest):
        return f"reclaim for tenant {trigger.tenant} (under its nominal quota): {who}"
    if isinstance(trigger, FairShareTrigger):
        return f"fair-share preemption: {who}"
    return f"priority preemption: {who}"


def excluded_text(excluded: Sequence[tuple[str, int]]) -> str:
    if not excluded:
        return "no running job was excluded"
    return "excluded: " + "; ".join(f"{count} job{'s' if count > 1 else ''} {why}" for why, count in excluded)


def order_text(order: VictimOrder) -> str:
    return f"victims preferred by order {order.name!r}: {order.criteria}"


def plan_text(victims: Sequence[CandidateFacts], nodes: Sequence[str], preemptor: Preemptor) -> str:
    noun = "job" if len(victims) == 1 else "jobs"
    where = ", ".join(nodes)
    listed = "; ".join(victim_summary(facts) for facts in victims)
    return f"preempting {len(victims)} {noun} on {where} so that {preemptor.job_id} fits: {listed}"
