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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpusched_core import preemption as sel
from gpusched_core.preemption.fairshare import fair_selection, fair_share_trigger
from gpusched_core.quota import UNITS_PER_GPU, QuotaBook, QuotaSnapshot
from gpusched_core.quota.fairness import DEFAULT_FAIR_PREEMPTION_MARGIN

if TYPE_CHECKING:
    from .engine import Replay


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    """Whether the replay preempts, and how (the live defaults). ``fair_margin``: the margin of fair backfill
    and fair-share preemption, each on as the live quota and preemption services (GPUSCHED_FAIR_*; None:
    neither); ``fair_quantum_s``: runs younger lose nothing to fair share."""

    enabled: bool = True
    grace_s: float = 30.0
    min_runtime_s: float = 60.0
    cross_tenant: Literal["any", "borrowing-only"] = "any"
    fair_margin: float | None = DEFAULT_FAIR_PREEMPTION_MARGIN
    fair_backfill: bool = True
    fair_preemption: bool = True
    fair_quantum_s: float = 600.0

    @property
    def selection(self) -> sel.SelectionConfig:
        return sel.SelectionConfig(default_min_runtime_s=self.min_runtime_s, cross_tenant=self.cross_tenant)

    @property
    def fair_selection(self) -> sel.SelectionConfig:
        """As the preemption service weighs fair share (``fairshare.fair_selection``)."""
        return fair_selection(self.selection, self.fair_quantum_s)


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
    plan = sel.select_victims(state.cluster.snapshot, me, _running(state), state.now_s, trigger=sel.PriorityTrigger(),
                              quota=_quotas(state, model), config=settings.selection, policy=state.cluster.policy)
    if plan.outcome != "preempt" or not plan.victims or plan.placement is None:
        state.refused.add(key)
        return None
    return plan


def fair_victims_for(state: Replay, demand: Mapping[tuple[str, str], float], job_id: str, tenant: str,
                     priority: int, units: int, gpus: int, model: str) -> sel.PreemptionPlan | None:
    """The plan that lets ``job_id`` (``units`` of quota of ``model``, not yet charged) start by taking runs of
    tenants far over their fair share, as the preemption service does for a job that holds quota and waits
    for room (``preemption.fairshare``), or None. ``demand``: the cycle's (the job's units among it)."""
    settings = state.preemption
    if not settings.enabled or not settings.fair_preemption or settings.fair_margin is None or state.tenancy is None:
        return None
    key = (tenant, priority, gpus, model)
    if key in state.refused_fair:
        return None  # a job of this tenant and shape found no victims at this instant already
    oldest = state.now_s - max(settings.min_runtime_s, settings.fair_quantum_s)
    if not any(run.tenant != tenant and run.start_s <= oldest and run.stopping_for is None
               for run in state.running.values()):
        state.refused_fair.add(key)
        return None  # nothing fair share could take
    usage = {t: dict(row) for t, row in state.usage.items()}
    usage.setdefault(tenant, {})[model] = usage.get(tenant, {}).get(model, 0) + units  # as if it held its quota
    trigger = fair_share_trigger(QuotaSnapshot(state.tenancy, usage, state.history, state.now_s), demand, tenant,
                                 model, units, settings.fair_margin)
    plan = None
    if trigger is not None:
        me = sel.Preemptor(job_id, tenant, priority, state.cluster.request(job_id, gpus, model), units)
        plan = sel.select_victims(state.cluster.snapshot, me, _running(state), state.now_s, trigger=trigger,
                                  config=settings.fair_selection, policy=state.cluster.policy)
    if plan is None or plan.outcome != "preempt" or not plan.victims or plan.placement is None:
        state.refused_fair.add(key)
        return None
    return plan


def _running(state: Replay) -> list[sel.RunningJob]:
    return [sel.RunningJob(j, run.tenant, state.outcomes[j].job.priority, run.start_s, (j,),
                           units=run.units or state.outcomes[j].job.gpus * UNITS_PER_GPU,
                           preempting=run.stopping_for is not None, flavor=run.flavor)
            for j, run in state.running.items()]


def _quotas(state: Replay, model: str) -> dict[str, sel.TenantQuota] | None:
    """Each tenant's nominal quota and usage of ``model`` (who borrows, for ``borrowing-only``)."""
    if state.tenancy is None:
        return None
    book = QuotaBook.from_usage(state.tenancy, state.usage)
    if model not in state.tenancy.flavors:
        return None
    return {t: sel.TenantQuota(book.nominal(t, model), book.used(t, model)) for t in state.tenancy.leaves()}
