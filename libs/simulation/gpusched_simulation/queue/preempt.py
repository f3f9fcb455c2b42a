"""Victims for the queue simulation's preemptions, chosen by the live preemption core
(``gpusched_core.preemption``) from the simulator's state.

What the core is given: the placement snapshot the cluster keeps (a run holds one allocation under its
job id, a gang all its members under that one id, so a gang goes whole); every run as a ``RunningJob``
(tenant, quota units, start); and the tenants' nominal quota and usage. A preempted run keeps its
progress and pays the checkpoint restore (``overhead_s``) when it resumes, so each run's last
checkpoint is given as ``overhead_s`` ago: the work a victim loses is that restore time on every GPU it
holds, and the core's victim order (borrowers first, then less work lost) prefers, among as few
victims, those holding fewer GPUs. A run started at this very event time is protected
(``JUST_STARTED_S``): this schedule has just placed it.

Three triggers, each for one blocked job that the engine starts at once (``engine``):

- reclaim: a quota ``ReclaimRequest`` (a tenant under its nominal quota while others borrow) goes to
  ``plan_reclaim`` for the request's first job: the fewest borrowers' runs whose release lets that job
  be placed and gives back the quota it lacks; borrowers lose runs only while they borrow. Nothing is
  preempted unless both hold.
- LAS: a first-queue job blocked while second-queue runs (``attained >= threshold``) hold the room is
  a priority preemption: second-queue runs have priority ``SECOND_QUEUE``, first-queue runs and the
  preemptor ``FIRST_QUEUE``, so only second-queue runs are taken; another tenant's only while it
  borrows. When the job's own tenant lacks quota, its own second-queue runs are taken for quota first
  (``top_up``); capacity is then searched with them released.
- fair share (``fair_victims``): a waiting job whose tenant stays within its fair entitlement once it
  runs takes runs of tenants whose fair share is above what its tenant's becomes by more than the
  margin (``quota.fairness.fair_victim_tenants``): those runs have priority ``SECOND_QUEUE``, the rest
  and the preemptor ``FIRST_QUEUE``. Runs younger than the quantum (``fair_quantum_s``) are protected:
  a tenant over its share loses a run only after it has had that long, which bounds the churn.

Two rules stay filters of the running jobs given to the core, which cannot express them:

- no tenant is pushed below its nominal quota by someone else's work (``borrowing_runs``): another
  tenant's run is a candidate only while that tenant borrows at least the run's units (for a reclaim,
  the core's own rule is the fallback when no such set lets the owner start). The core lets a
  borrower's last victim cross what it borrows (it "loses jobs only while it still borrows"); a
  tenant pushed under its nominal quota that way reclaims in turn, and the replay then preempts in
  cascades (at 32 nodes, DRF's Jain index falls from 0.922 to 0.908 with the core's rule alone).
- ``fair_gangs``: a job of a whole node or more takes runs only of its own tenant or of tenants whose
  fair share (the quota order's, ``gpusched_core.quota.fairness``) is above its tenant's. The core's ``FairShareTrigger`` weighs current usage
  instead of the decayed shares the fair-share order uses, and never takes the preemptor's own
  tenant's runs, which LAS must.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from gpusched_core.preemption import (
    PriorityTrigger,
    ReclaimAsk,
    RunningJob,
    SelectionConfig,
    TenantQuota,
    classify,
    plan_reclaim,
    released,
    select_victims,
    top_up,
    victim_order,
)
from gpusched_core.preemption import Preemptor as CorePreemptor
from gpusched_core.quota import UNITS_PER_GPU, QuotaBook, QuotaSnapshot, ReclaimRequest
from gpusched_core.quota.fairness import fair_entitlements, fair_shares, fair_victim_tenants, queue_demand

from .cluster import FLAVOR, placement_request
from .state import PRIORITY_CLASS, Run, SimState

FIRST_QUEUE, SECOND_QUEUE = 1, 0  # the LAS queues as priorities: a first-queue job preempts second-queue runs
RECLAIM_PRIORITY = 0  # a reclaim does not look at priority
JUST_STARTED_S = 1e-6  # the minimum run time: protects exactly the runs started at this event time
CONFIG = SelectionConfig(default_min_runtime_s=JUST_STARTED_S)
ORDER = victim_order(CONFIG.victim_order)


def reclaim_victims(state: SimState, request: ReclaimRequest) -> list[str]:
    """Borrowers' runs whose preemption lets the request's first job start now, or none: runs that keep
    every borrower at or above its nominal quota when there are such, else by the core's own rule."""
    job_id = request.for_jobs[0]
    ask = ReclaimAsk(request.tenant, request.flavor, request.units, request.borrowers, state.now_s)
    me = preemptor(state, job_id, RECLAIM_PRIORITY)
    running = running_jobs(state, lambda run: RECLAIM_PRIORITY)
    preferred = borrowing_runs(state, running, request.tenant)
    for candidates in (preferred, running) if len(preferred) < len(running) else (running,):
        plan = plan_reclaim(state.cluster.snapshot, me, ask, candidates, (), state.now_s, config=CONFIG,
                            policy=state.cluster.policy)  # fmt: skip
        if plan.outcome == "preempt":
            return list(plan.victim_ids)
    return []


def las_victims(state: SimState, job_id: str, threshold_gpu_s: float, fair_gangs: bool = False) -> list[str]:
    """Second-queue runs whose preemption lets first-queue job ``job_id`` start now (quota and nodes),
    or none. With ``fair_gangs``, a job of a whole node or more takes runs only from its own tenant or
    from tenants whose fair share is above its tenant's: such jobs run long, so attained service
    says little about which of two should go first, and their victims need whole nodes again to resume;
    fair share decides instead."""
    job = state.jobs[job_id].job

    def queue_of(run: Run) -> int:
        return SECOND_QUEUE if state.attained(run) >= threshold_gpu_s else FIRST_QUEUE

    running = borrowing_runs(state, running_jobs(state, queue_of), job.tenant)
    if fair_gangs and job.gpus >= state.cluster.gpus_per_node:
        shares = _shares(QuotaSnapshot(state.tenancy, state.usage, state.history, state.now_s), state)[1]
        mine = shares.get(job.tenant, 0.0)
        running = [r for r in running if r.tenant == job.tenant or shares.get(r.tenant, 0.0) > mine]
    if not any(r.priority == SECOND_QUEUE and r.started_at_s < state.now_s for r in running):
        return []  # nothing the core could take: skip asking it
    me = preemptor(state, job_id, FIRST_QUEUE)
    book = QuotaBook.from_usage(state.tenancy, state.usage)
    for_quota = _own_quota_victims(state, me, running, book)
    if for_quota is None:
        return []
    taken = [r.job_id for r in for_quota]
    snapshot = released(state.cluster.snapshot, taken)
    rest = [r for r in running if r.job_id not in taken]
    plan = select_victims(snapshot, me, rest, state.now_s, trigger=PriorityTrigger(), quota=tenant_quotas(state, book),
                          config=CONFIG, policy=state.cluster.policy)  # fmt: skip
    if plan.outcome == "none":
        return []
    return [*(r.job_id for r in for_quota), *plan.victim_ids]


def fair_victims(state: SimState, margin: float, quantum_s: float) -> tuple[str, list[str]] | None:
    """The first queue head, lowest fair share first, that may preempt by fair share and the runs whose
    preemption lets it start now (``(job, victims)``), or None."""
    snapshot = QuotaSnapshot(state.tenancy, state.usage, state.history, state.now_s)
    queues = state.pending_queues()
    entitled, shares = _shares(snapshot, state, queues)
    book = QuotaBook.from_usage(state.tenancy, state.usage)
    config = SelectionConfig(default_min_runtime_s=max(quantum_s, JUST_STARTED_S))
    for queue in sorted(queues, key=lambda q: (shares.get(q.tenant, 0.0), q.tenant)):
        job = queue.entries[0][1]
        victims = fair_victim_tenants(snapshot, shares, entitled, job.tenant, FLAVOR, job.ask.units, margin)
        if not victims:
            continue
        running = borrowing_runs(state, running_jobs(state, lambda run: SECOND_QUEUE if run.tenant in victims
                                                     else FIRST_QUEUE), job.tenant)  # fmt: skip
        if not any(r.priority == SECOND_QUEUE and r.started_at_s <= state.now_s - quantum_s for r in running):
            continue
        plan = select_victims(state.cluster.snapshot, preemptor(state, job.job_id, FIRST_QUEUE), running,
                              state.now_s, trigger=PriorityTrigger(), quota=tenant_quotas(state, book),
                              config=config, policy=state.cluster.policy)  # fmt: skip
        if plan.outcome != "none" and plan.victim_ids and _quota_after(state, book, job.tenant, job.ask.units,
                                                                       plan.victim_ids):  # fmt: skip
            return job.job_id, list(plan.victim_ids)
    return None


def _quota_after(state: SimState, book: QuotaBook, tenant: str, units: int, victims: tuple[str, ...]) -> bool:
    """Whether the tenant has quota for ``units`` once ``victims`` gave theirs back."""
    after = book.copy()
    for job_id in victims:
        run = state.running[job_id]
        after.charge(run.tenant, FLAVOR, -run.units)
    return units <= after.available(tenant, FLAVOR)


def _shares(snapshot: QuotaSnapshot, state: SimState, queues: list | None = None) -> tuple[dict, dict[str, float]]:
    """Fair entitlements and the fair shares of every tenant with demand, queued or only running (a
    tenant whose jobs all run can still be over its share)."""
    demand = queue_demand(snapshot, state.pending_queues() if queues is None else queues)
    return fair_entitlements(snapshot, demand), fair_shares(snapshot, demand)


def _own_quota_victims(state: SimState, me: CorePreemptor, running: list[RunningJob],
                       book: QuotaBook) -> tuple[RunningJob, ...] | None:  # fmt: skip
    """The tenant's own second-queue runs that give back the quota its job lacks (charged off ``book``),
    () when it lacks none, None when they cannot."""
    short = me.units - book.available(me.tenant, FLAVOR)
    if short <= 0:
        return ()
    own = [r for r in running if r.tenant == me.tenant]
    eligibility = classify(state.cluster.snapshot, me, own, state.now_s, PriorityTrigger(), {}, CONFIG, ORDER)
    extra = top_up(eligibility, (), math.ceil(short))
    if extra is None:
        return None
    for facts in extra:
        book.charge(me.tenant, FLAVOR, -facts.job.units)
    return tuple(facts.job for facts in extra) if me.units <= book.available(me.tenant, FLAVOR) else None


def preemptor(state: SimState, job_id: str, priority: int) -> CorePreemptor:
    job = state.jobs[job_id].job
    request = placement_request(job_id, job.gpus, state.cluster.gpus_per_node)
    return CorePreemptor(job_id, job.tenant, priority, request, job.gpus * UNITS_PER_GPU)


def running_jobs(state: SimState, priority: Callable[[Run], int]) -> list[RunningJob]:
    """Every run as the core sees it; its last checkpoint ``overhead_s`` ago (see the module doc)."""
    checkpoint_s = state.now_s - state.overhead_s
    return [RunningJob(run.job_id, run.tenant, priority(run), run.start_s, (run.job_id,), PRIORITY_CLASS, run.units,
                       checkpoint_s, flavor=FLAVOR) for run in state.running.values()]  # fmt: skip


def borrowing_runs(state: SimState, running: list[RunningJob], tenant: str) -> list[RunningJob]:
    """``tenant``'s runs, and those of other tenants that borrow at least the run's units (module doc)."""
    borrowed = {t: state.used(t) - state.tenancy.nominal_units(t, FLAVOR) for t in {r.tenant for r in running}}
    return [r for r in running if r.tenant == tenant or borrowed[r.tenant] >= r.units]


def tenant_quotas(state: SimState, book: QuotaBook) -> dict[str, TenantQuota]:
    return {t: TenantQuota(book.nominal(t, FLAVOR), book.used(t, FLAVOR)) for t in state.tenancy.leaves()}
