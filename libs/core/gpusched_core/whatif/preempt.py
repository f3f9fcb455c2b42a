"""Victims for the what-if replay, chosen by the live preemption core (``gpusched_core.preemption``) as the
preemption service chooses them for a job placement cannot place: a priority trigger (victims of strictly
lower priority), runs younger than the minimum run-time protected, another tenant's runs always or only
while it borrows (``cross_tenant``), the fewest victims, gangs whole, the slot verified with the replay's
own placement policy. The defaults are the live service's (``services/preemption/settings.py``:
GPUSCHED_PREEMPTION_GRACE_S 30, GPUSCHED_PREEMPTION_MIN_RUNTIME_S 60, GPUSCHED_PREEMPTION_CROSS_TENANT any).

What the core is given: the replay cluster's snapshot (a run holds one allocation under its job id, a
gang all its members under that one id), every run as a ``RunningJob`` (tenant, priority, start, quota
units and flavor) and, with a tenancy, each tenant's nominal quota and usage of the preemptor's model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpusched_core import preemption as sel
from gpusched_core.quota import UNITS_PER_GPU, QuotaBook

if TYPE_CHECKING:
    from .engine import Replay


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    """Whether the replay preempts, and how (the live defaults)."""

    enabled: bool = True
    grace_s: float = 30.0
    min_runtime_s: float = 60.0
    cross_tenant: Literal["any", "borrowing-only"] = "any"

    @property
    def selection(self) -> sel.SelectionConfig:
        return sel.SelectionConfig(default_min_runtime_s=self.min_runtime_s, cross_tenant=self.cross_tenant)


def victims_for(state: Replay, job_id: str, tenant: str, priority: int, gpus: int,
                model: str) -> sel.PreemptionPlan | None:
    """The plan that lets ``job_id`` (``gpus`` of ``model``) start by preempting lower-priority runs, or None
    (preemption off, nothing old enough of a lower priority, or no allowed set of victims frees a slot)."""
    settings = state.preemption
    if not settings.enabled:
        return None
    key = (priority, gpus, model)
    if key in state.refused:
        return None  # a job of this shape and priority found no victims at this instant already
    oldest = state.now_s - settings.min_runtime_s
    if not any(state.outcomes[j].job.priority < priority and run.start_s <= oldest and run.stopping_for is None
               for j, run in state.running.items()):
        state.refused.add(key)
        return None  # nothing the core could take: skip asking it
    me = sel.Preemptor(job_id, tenant, priority, state.cluster.request(job_id, gpus, model), gpus * UNITS_PER_GPU)
    running = [sel.RunningJob(j, run.tenant, state.outcomes[j].job.priority, run.start_s, (j,),
                              units=run.units or state.outcomes[j].job.gpus * UNITS_PER_GPU,
                              preempting=run.stopping_for is not None, flavor=run.flavor)
               for j, run in state.running.items()]
    plan = sel.select_victims(state.cluster.snapshot, me, running, state.now_s, trigger=sel.PriorityTrigger(),
                              quota=_quotas(state, model), config=settings.selection, policy=state.cluster.policy)
    if plan.outcome != "preempt" or not plan.victims or plan.placement is None:
        state.refused.add(key)
        return None
    return plan


def _quotas(state: Replay, model: str) -> dict[str, sel.TenantQuota] | None:
    """Each tenant's nominal quota and usage of ``model`` (who borrows, for ``borrowing-only``)."""
    if state.tenancy is None:
        return None
    book = QuotaBook.from_usage(state.tenancy, state.usage)
    if model not in state.tenancy.flavors:
        return None
    return {t: sel.TenantQuota(book.nominal(t, model), book.used(t, model)) for t in state.tenancy.leaves()}
