"""Start-time estimates by a forward simulation of the queue, Slurm's ``squeue --start`` (pure).

From ``now``: every running job ends at its start plus its run-time estimate (``runtimes``); at each end
its GPUs and its quota are free again. At ``now`` and after every end, two stages run as the live services
do: the jobs waiting for quota, in the quota cycle's queue order as given, reserve quota where their
tenant's quota (``QuotaBook``: nominal, borrowing and lending limits, the cohort's pool) has room on one of
their GPU models; then the jobs holding quota are placed, in placement's order (priority, then
submission), where a node of that model has room (``capacity``). A job started at time ``t`` is estimated
to start at ``t``. Preemption, dependencies and new arrivals are not foreseen. A job that could never fit
(no node big enough, more than its tenant may ever hold) is ``never``; one not started within
``horizon_s``, or when nothing running is left to end, is ``unknown``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpusched_core.placement.model import MILLI_PER_GPU
from gpusched_core.quota import UNITS_PER_GPU, QuotaBook, Tenancy, UnitError, units_for

from .capacity import FreeGpus
from .model import EstimateConfig, Estimate, FinishedRun, Hold, NodeGpus, RunningJob, RuntimeEstimate, WaitingJob
from .runtimes import RuntimeModel

Charge = tuple[str, str, int]  # (leaf tenant, flavor, units)


@dataclass
class _Queued:
    job: WaitingJob
    runtime: RuntimeEstimate
    models: tuple[str, ...]  # the models it may still take, in order of preference
    charge: Charge | None = None

    @property
    def placement_key(self) -> tuple:
        return (-self.job.priority, self.job.submitted_at_s, self.job.job_id)


class _Quota:
    """The tenancy's book, or no quota at all (``tenancy`` None: every job fits quota)."""

    def __init__(self, tenancy: Tenancy | None) -> None:
        self.tenancy = tenancy
        self.book = QuotaBook.from_usage(tenancy, {}) if tenancy is not None else None

    def leaf(self, tenant: str) -> str | None:
        if self.tenancy is None:
            return tenant
        charged = self.tenancy.charged_tenant(tenant)
        return charged if charged in self.tenancy.tenants and self.tenancy.tenants[charged].is_leaf else None

    def units(self, job: WaitingJob | RunningJob, model: str) -> int:
        slices = self.tenancy.mig_slices_per_gpu if self.tenancy is not None else {}
        return units_for(job.shape.ask(model), model, slices)

    def charge(self, charge: Charge | None, sign: int = 1) -> None:
        if self.book is not None and charge is not None and charge[1] in self.book.tenancy.flavors \
                and charge[0] in self.book.tree.index:
            self.book.charge(charge[0], charge[1], sign * charge[2])

    def fits(self, charge: Charge, ever: bool = False) -> bool:
        if self.book is None:
            return True
        leaf, flavor, units = charge
        if flavor not in self.book.tenancy.flavors:
            return False
        room = self.book.most_ever(leaf, flavor) if ever else self.book.available(leaf, flavor)
        return units <= room

    def options(self, leaf: str, cluster_models: tuple[str, ...]) -> tuple[str, ...]:
        if self.tenancy is None:
            return cluster_models
        return tuple(m for m in self.tenancy.preferred_flavors(leaf) if m in cluster_models)


def plan_estimates(nodes: Iterable[NodeGpus], running: Iterable[RunningJob], waiting: Sequence[WaitingJob],
                   finished: Iterable[FinishedRun], now_s: float, tenancy: Tenancy | None = None,
                   config: EstimateConfig = EstimateConfig()) -> tuple[Estimate, ...]:
    """Each waiting job's estimate, in the order given (see the module's docstring)."""
    runtimes = RuntimeModel.of(finished, now_s, config)
    free, quota = FreeGpus(nodes), _Quota(tenancy)
    model_of = {node_id: model for model, ids in free.by_model.items() for node_id in ids}
    ends: list[tuple[float, int, str, tuple[Hold, ...], Charge | None]] = []
    for n, job in enumerate(running):
        free.take(job.holds)
        charge = _running_charge(quota, job, model_of)
        quota.charge(charge)
        left = runtimes.remaining(job.tenant, job.shape, job.time_limit_s, max(0.0, now_s - job.started_at_s))
        heapq.heappush(ends, (now_s + left.seconds, n, job.job_id, job.holds, charge))
    out: dict[str, Estimate] = {}
    for_quota: list[_Queued] = []
    for_gpus: list[_Queued] = []
    for job in waiting:
        entry, never = _admit(job, runtimes, free, quota)
        if never is not None:
            out[job.job_id] = _estimate(job, None, now_s, entry.runtime, never)
        elif entry.charge is not None and job.reserved_model is not None:
            quota.charge(entry.charge)
            for_gpus.append(entry)
        else:
            for_quota.append(entry)
    seq, t, trigger = len(ends), now_s, None
    while for_quota or for_gpus:
        for entry in list(for_quota):
            if _reserve(entry, quota):
                for_quota.remove(entry)
                for_gpus.append(entry)
        for_gpus.sort(key=lambda e: e.placement_key)
        for entry in list(for_gpus):
            holds = next((h for m in entry.models if (h := free.fit(entry.job.shape, m)) is not None), None)
            if holds is None:
                continue
            free.take(holds)
            for_gpus.remove(entry)
            seq += 1
            heapq.heappush(ends, (t + entry.runtime.seconds, seq, entry.job.job_id, holds, entry.charge))
            why = "fits now: the next cycles should start it" if trigger is None else "once a running job ends"
            out[entry.job.job_id] = _estimate(entry.job, t, now_s, entry.runtime, why, trigger)
        if not (for_quota or for_gpus) or not ends or ends[0][0] - now_s > config.horizon_s:
            break
        t = ends[0][0]
        while ends and ends[0][0] <= t:
            _, _, trigger, holds, charge = heapq.heappop(ends)
            free.give(holds)
            quota.charge(charge, -1)
    for entry in for_quota + for_gpus:
        what = "quota" if entry in for_quota else "GPUs"
        why = (f"not started within {config.horizon_s / 86400:g} days" if ends else
               f"not started once every run has ended: the {what} it needs never free up")
        out[entry.job.job_id] = _estimate(entry.job, None, now_s, entry.runtime, f"unknown: {why}")
    return tuple(out[job.job_id] for job in waiting)


def _running_charge(quota: _Quota, job: RunningJob, model_of: dict[str, str]) -> Charge | None:
    leaf = quota.leaf(job.tenant)
    model = next((model_of[h.node_id] for h in job.holds if h.node_id in model_of), None)
    if leaf is None or model is None:
        return None
    return leaf, model, sum(h.milli for h in job.holds) * UNITS_PER_GPU // MILLI_PER_GPU


def _admit(job: WaitingJob, runtimes: RuntimeModel, free: FreeGpus,
           quota: _Quota) -> tuple[_Queued, str | None]:
    """The job as queued, with the models it could ever run on; or why it never can."""
    runtime = runtimes.estimate(job.tenant, job.shape, job.time_limit_s)
    entry = _Queued(job, runtime, ())
    leaf = quota.leaf(job.tenant)
    if leaf is None:
        return entry, f"never: tenant {job.tenant} is not a team of the tenancy in force"
    wanted = job.reserved_model or job.shape.model
    models = (wanted,) if wanted else quota.options(leaf, free.models)
    fitting = tuple(m for m in models if free.could_ever_fit(job.shape, m))
    if not fitting:
        return entry, f"never: no node{' of ' + ', '.join(models) if models else ''} could hold it"
    try:
        allowed = tuple(m for m in fitting if job.reserved_model or quota.fits((leaf, m, quota.units(job, m)), True))
    except UnitError as exc:
        return entry, f"never: {exc}"
    if not allowed:
        return entry, f"never: it asks more than tenant {job.tenant} may ever hold of {', '.join(fitting)}"
    entry.models = allowed
    if job.reserved_model is not None:
        entry.charge = (leaf, job.reserved_model, quota.units(job, job.reserved_model))
    return entry, None


def _reserve(entry: _Queued, quota: _Quota) -> bool:
    """Reserve quota on the first model it fits; the job then waits for GPUs of that model."""
    leaf = quota.leaf(entry.job.tenant)
    assert leaf is not None
    for model in entry.models:
        charge = (leaf, model, quota.units(entry.job, model))
        if quota.fits(charge):
            quota.charge(charge)
            entry.charge, entry.models = charge, (model,)
            return True
    return False


def _estimate(job: WaitingJob, start_s: float | None, now_s: float, runtime: RuntimeEstimate,
              reason: str, after_job: str | None = None) -> Estimate:
    return Estimate(job.job_id, job.position, start_s, None if start_s is None else start_s - now_s,
                    runtime.seconds, runtime.source, reason, after_job)
