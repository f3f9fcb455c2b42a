"""Who may be a victim for a trigger, and why every other running job may not.

Rules (all triggers): never the preemptor itself, never a job already being preempted (its
resources count as freed instead), never a protected job (its run is younger than the minimum run
time of its priority class), never a job whose allocations are not in the snapshot.

- priority: only jobs of strictly lower priority; another tenant's jobs only while that tenant
  borrows (``cross_tenant="borrowing-only"``, the default), and then only its borrowed units.
- reclaim: only jobs of the listed borrowers (never the reclaiming tenant's), any priority unless
  ``reclaim_lower_priority_only``; a borrower loses jobs only while it still borrows.
- fair-share: only jobs of priority <= the preemptor's, of tenants whose share stays at or above the
  preemptor tenant's share once it runs (a budget of units per tenant, never exceeded).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpusched_core.placement import MILLI_PER_GPU, ClusterSnapshot, mig_profile

from .model import (
    FairShareTrigger,
    Preemptor,
    ReclaimRequest,
    RunningJob,
    SelectionConfig,
    TenantQuota,
    Trigger,
)
from .ordering import CandidateFacts, SortKey, VictimOrder

MIG_SLICES_PER_GPU = 8


@dataclass(frozen=True, slots=True)
class TenantLimit:
    """Units a tenant may lose. ``overshoot``: one more job may cross the budget (the tenant was
    still over it before that job was taken: "loses jobs only while it still borrows")."""

    budget_units: float
    overshoot: bool


@dataclass(frozen=True)
class Eligibility:
    """Candidates (cheapest first), jobs already being preempted, and counts of excluded jobs by reason."""

    candidates: tuple[CandidateFacts, ...]
    keys: Mapping[str, SortKey]
    awaiting: tuple[RunningJob, ...]
    excluded: tuple[tuple[str, int], ...]
    limits: Mapping[str, TenantLimit] = field(default_factory=dict)

    def allows(self, chosen: Iterable[CandidateFacts]) -> bool:
        """Whether taking all of ``chosen`` respects every tenant limit."""
        taken: dict[str, list[int]] = {}
        for facts in chosen:
            if facts.job.tenant in self.limits:
                taken.setdefault(facts.job.tenant, []).append(facts.job.units)
        for tenant, units in taken.items():
            limit, total = self.limits[tenant], sum(units)
            if limit.overshoot and total - max(units) >= limit.budget_units:
                return False
            if not limit.overshoot and total > limit.budget_units:
                return False
        return True


def held_gpu_milli(snapshot: ClusterSnapshot, allocation_ids: Iterable[str]) -> int:
    """GPU milli held under ``allocation_ids`` (a MIG slice counts by its share of memory slices)."""
    layout, total = snapshot.layout, 0
    for allocation_id in allocation_ids:
        for binding in snapshot.allocations.get(allocation_id, ()):  # type: ignore[call-overload]
            if binding.mig is None:
                total += binding.gpu_milli * len(binding.gpu_indices)
                continue
            row = layout.index_of[binding.node_id]
            for gpu in binding.gpu_indices:
                profile = mig_profile(layout.models[layout.gpu_model[row, gpu]], binding.mig.profile)
                slices = profile.memory_slices if profile is not None else 0
                total += slices * MILLI_PER_GPU // MIG_SLICES_PER_GPU
    return total


def lost_work_s(job: RunningJob, now_s: float) -> float:
    """Seconds of work lost if the job stopped now: since its last checkpoint, else since its start."""
    mark = job.started_at_s
    if job.last_checkpoint_at_s is not None:
        mark = max(mark, job.last_checkpoint_at_s)
    return max(0.0, now_s - mark)


def _borrowing(quota: Mapping[str, TenantQuota], tenant: str) -> bool:
    entry = quota.get(tenant)
    return entry is not None and entry.borrowed_units > 0


def _limits(trigger: Trigger, preemptor: Preemptor, quota: Mapping[str, TenantQuota],
            config: SelectionConfig) -> dict[str, TenantLimit]:  # fmt: skip
    if isinstance(trigger, ReclaimRequest):
        return {tenant: TenantLimit(units, True) for tenant, units in trigger.borrowers}
    if isinstance(trigger, FairShareTrigger):
        weight = trigger.weights.get(preemptor.tenant, 1.0) or 1.0
        final = (trigger.usage_units.get(preemptor.tenant, 0) + preemptor.units) / weight
        return {tenant: TenantLimit(usage - final * (trigger.weights.get(tenant, 1.0) or 1.0), False)
                for tenant, usage in trigger.usage_units.items() if tenant != preemptor.tenant}  # fmt: skip
    if config.cross_tenant == "any":
        return {}
    return {tenant: TenantLimit(entry.borrowed_units, True) for tenant, entry in quota.items()
            if tenant != preemptor.tenant}  # fmt: skip


def _exclusion(job: RunningJob, preemptor: Preemptor, trigger: Trigger, quota: Mapping[str, TenantQuota],
               limits: Mapping[str, TenantLimit], config: SelectionConfig) -> str | None:  # fmt: skip
    """Why ``job`` may not be a victim for this trigger (None: it may), before protection."""
    if isinstance(trigger, ReclaimRequest):
        if job.tenant == trigger.tenant:
            return "of the reclaiming tenant itself"
        if job.tenant not in limits or limits[job.tenant].budget_units <= 0:
            return "of tenants that do not borrow"
        if config.reclaim_lower_priority_only and job.priority >= preemptor.priority:
            return "of equal or higher priority"
        return None
    if isinstance(trigger, FairShareTrigger):
        if job.tenant == preemptor.tenant:
            return "of the preemptor's own tenant (fair share is between tenants)"
        if job.priority > preemptor.priority:
            return "of higher priority"
        if job.tenant not in limits or limits[job.tenant].budget_units <= 0:
            return "of tenants at or below the preemptor's fair share"
        return None
    if job.priority >= preemptor.priority:
        return "of equal or higher priority"
    if job.tenant != preemptor.tenant and config.cross_tenant == "borrowing-only" and not _borrowing(quota, job.tenant):
        return "of other tenants within their quota"
    return None


def classify(snapshot: ClusterSnapshot, preemptor: Preemptor, running: Sequence[RunningJob], now_s: float,
             trigger: Trigger, quota: Mapping[str, TenantQuota], config: SelectionConfig,
             order: VictimOrder) -> Eligibility:  # fmt: skip
    """Split ``running`` into candidates (sorted by ``order``), awaited jobs and excluded counts."""
    limits = _limits(trigger, preemptor, quota, config)
    candidates: list[CandidateFacts] = []
    awaiting: list[RunningJob] = []
    excluded: Counter[str] = Counter()
    for job in running:
        if job.job_id == preemptor.job_id:
            continue
        if any(a not in snapshot.allocations for a in job.allocation_ids):
            excluded["not allocated in the snapshot"] += 1
            continue
        if job.preempting:
            awaiting.append(job)
            continue
        why = _exclusion(job, preemptor, trigger, quota, limits, config)
        protection = config.protection_s(job.priority_class)
        if why is None and now_s - job.started_at_s < protection:
            why = f"protected (running less than the minimum run time, {protection:g} s)"
        if why is not None:
            excluded[why] += 1
            continue
        borrowing = _borrowing(quota, job.tenant) or isinstance(trigger, ReclaimRequest)
        milli = held_gpu_milli(snapshot, job.allocation_ids)
        candidates.append(CandidateFacts(job, milli, lost_work_s(job, now_s), borrowing))
    candidates.sort(key=order.key)
    keys = {facts.job.job_id: order.key(facts) for facts in candidates}
    awaiting.sort(key=lambda job: job.job_id)
    return Eligibility(tuple(candidates), keys, tuple(awaiting), tuple(sorted(excluded.items())), limits)
