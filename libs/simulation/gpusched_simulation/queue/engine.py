"""The virtual-clock replay: arrivals, quota + fair-share ordering, placement, completions, preemption.

At every event time: decay usage histories to now, finish the runs that end, enqueue the arrivals, then
schedule: one quota cycle (``QuotaCycle`` from the quota core, ``explain=False``) walks pending work in
the policy's order; each job that fits quota is placed by the placement core's first-fit, or deferred
when no node has room (with fair backfill, such a job, or one larger than all that is free, holds back
tenants far over their share for the rest of the cycle: ``backfill``). Policies with reclaim turn the
cycle's ``ReclaimRequest``s into preemptions of borrowers; LAS policies preempt second-queue runs for a
blocked first-queue job; with fair-share preemption, the waiting tenant furthest under its fair share
takes runs of tenants well over theirs (the victims are the live preemption core's choice, ``preempt``).
A preemption is made for one job (the reclaim's first job, the blocked LAS job), which is then started
at once, before the next cycle could hand the room it made to someone else (Kueue's "nominated"
workload): room made for nobody only strands its victims. Then the cycle runs again (at most
``MAX_REPLANS`` times per event time).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpusched_core.quota import UNITS_PER_GPU, PendingJob, PendingQueue, QuotaCycle, QuotaSnapshot, Tenancy
from gpusched_core.quota.backfill import FairBackfill

from ..traces.philly import TraceJob
from .cluster import FLAVOR, Cluster
from .policies import Policy
from .preempt import fair_victims, las_victims, reclaim_victims
from .state import JobState, SimState

MAX_REPLANS = 4
Progress = Callable[[float, int, int], None]  # (virtual now, jobs done, jobs pending)


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 64
    gpus_per_node: int = 8
    las_threshold_gpu_s: float = 3600.0
    preempt_overhead_s: float = 60.0


def simulate(jobs: Sequence[TraceJob], tenancy: Tenancy, policy: Policy, config: SimConfig,
             progress: Progress | None = None) -> SimState:
    """Replay ``jobs`` (sorted by arrival) to the last completion; returns the final state."""
    durations = {job.job_id: job.duration_s for job in jobs}
    state = SimState(tenancy, Cluster(config.nodes, config.gpus_per_node), policy.job_order(durations))
    state.overhead_s = config.preempt_overhead_s
    state.jobs = {job.job_id: JobState(job, job.duration_s) for job in jobs}
    done, i, last_report = 0, 0, -math.inf
    while True:
        now = _next_time(state, jobs[i].arrival_s if i < len(jobs) else math.inf)
        if now == math.inf:
            break
        state.advance_history(now)
        state.now_s = now
        done += _complete_due(state)
        while i < len(jobs) and jobs[i].arrival_s <= now:
            state.enqueue(jobs[i].job_id, level=0)
            i += 1
        _schedule(state, policy, config)
        if progress is not None and now - last_report >= 86400:
            last_report = now
            progress(now, done, state.pending_count())
    return state


def _next_time(state: SimState, next_arrival: float) -> float:
    # a preempted run's end is no event: waking then would schedule at a time nothing changed
    state.completions.discard_stale(lambda end: state.epochs.get(end.item_id) == end.epoch)
    return min(next_arrival, state.completions.next_at())


def _complete_due(state: SimState) -> int:
    done = 0
    for end in state.completions.pop_due(state.now_s):
        job_id = end.item_id
        if state.epochs.get(job_id) != end.epoch or job_id not in state.running:
            continue
        state.stop(job_id)
        state.jobs[job_id].remaining_s = 0.0
        state.jobs[job_id].completed_s = state.now_s
        done += 1
    return done


def _schedule(state: SimState, policy: Policy, config: SimConfig) -> None:
    for _ in range(MAX_REPLANS):
        reclaims = _cycle(state, policy)
        nominated: list[str] = []
        if policy.reclaim:
            for request in reclaims:
                if _preempt(state, reclaim_victims(state, request), config, "reclaim", request.for_jobs[0]):
                    nominated.append(request.for_jobs[0])
        if policy.las and not nominated:
            nominated += _las(state, policy, config)
        if policy.fair_preemption_margin is not None and not nominated:
            found = fair_victims(state, policy.fair_preemption_margin, policy.fair_quantum_s)
            if found is not None and _preempt(state, found[1], config, "fair share", found[0]):
                nominated.append(found[0])
        if not nominated:
            return
        for job_id in nominated:
            _start_nominated(state, job_id)


def _cycle(state: SimState, policy: Policy) -> tuple:
    """One quota cycle with placement interleaved; returns the cycle's reclaim requests. With fair
    backfill, a job refused by the nodes holds back the tenants it could preempt (``backfill``)."""
    if not state.queues:
        return ()
    snapshot = QuotaSnapshot(state.tenancy, state.usage, state.history, state.now_s)
    queues = state.pending_queues()
    backfill = FairBackfill(snapshot, queues, policy.fair_preemption_margin) if _fair_backfill(policy) else None
    if backfill is not None:
        backfill.blocked_heads(queues, state.cluster.free_total * UNITS_PER_GPU)
    cycle = QuotaCycle(snapshot, queues, state.order, explain=False,
                       shares=backfill.shares if backfill is not None else None)
    started = []
    smallest_refused = math.inf
    while state.cluster.free_total > 0:
        candidate = cycle.next_candidate()
        if candidate is None:
            break
        if backfill is not None and backfill.holds_back(candidate.job, candidate.flavor, candidate.units):
            cycle.defer(candidate)
            continue
        gpus = state.jobs[candidate.job.job_id].job.gpus
        bindings = state.cluster.place(candidate.job.job_id, gpus) if gpus < smallest_refused else None
        if bindings is None:
            smallest_refused = min(smallest_refused, gpus)
            cycle.defer(candidate)
            if backfill is not None:
                backfill.blocked(candidate.job)
            continue
        reservation = cycle.reserve(candidate)
        started.append((candidate, reservation.units, bindings))
        if backfill is not None:
            backfill.started(candidate.job.tenant, candidate.flavor, reservation.units)
    plan = cycle.finish()
    for candidate, units, bindings in started:
        state.dequeue(candidate.job, _tenant_key(state, candidate.job))
        state.start(candidate.job.job_id, units, bindings)
    return plan.reclaims


def _fair_backfill(policy: Policy) -> bool:
    return policy.fair_backfill and policy.fair_preemption_margin is not None


def _tenant_key(state: SimState, job: PendingJob) -> tuple:
    return state.order.tenant_key(job, state.tenancy.priority_classes[job.priority_class])


def _start_nominated(state: SimState, job_id: str) -> None:
    """Start the job a preemption made room for, through a quota cycle of that job alone (so quota
    is checked by the core as always); nothing happens when it does not fit (a reclaim that could
    only free quota, not a place on the nodes)."""
    tenant = state.jobs[job_id].job.tenant
    entry = next((e for e in state.queues.get(tenant, ()) if e[1].job_id == job_id), None)
    if entry is None:
        return
    units = entry[1].ask.units
    snapshot = QuotaSnapshot(state.tenancy, state.usage, state.history, state.now_s)
    cycle = QuotaCycle(snapshot, [PendingQueue(tenant, FLAVOR, [entry], units, units, True)], state.order,
                       explain=False)
    candidate = cycle.next_candidate()
    bindings = state.cluster.place(job_id, state.jobs[job_id].job.gpus) if candidate is not None else None
    if candidate is None or bindings is None:
        cycle.finish()
        return
    reservation = cycle.reserve(candidate)
    cycle.finish()
    state.dequeue(entry[1], entry[0])
    state.start(job_id, reservation.units, bindings)


def _preempt(state: SimState, victims: list[str], config: SimConfig, cause: str, for_job: str) -> bool:
    """Stop ``victims`` for ``for_job`` and queue them again; each is counted under ``cause``, apart when it
    is of the preemptor's own tenant (LAS time-shares a tenant's own runs; no other trigger takes them)."""
    tenant = state.jobs[for_job].job.tenant
    for job_id in victims:
        state.stop(job_id)
        job_state = state.jobs[job_id]
        job_state.preemptions += 1
        state.preemptions += 1
        state.preemption_causes[cause + (" own tenant" if job_state.job.tenant == tenant else "")] += 1
        state.enqueue(job_id, level=1 if job_state.attained_gpu_s >= config.las_threshold_gpu_s else 0)
    return bool(victims)


def _las(state: SimState, policy: Policy, config: SimConfig) -> list[str]:
    """Preempt second-queue runs for the first blocked first-queue job (queue heads, in order); the
    job it was done for, or nothing."""
    heads = sorted((entries[0] for entries in state.queues.values() if entries), key=lambda e: e[0])
    for _, pending in heads:
        if pending.level != 0:
            continue
        victims = las_victims(state, pending.job_id, config.las_threshold_gpu_s, policy.fair_gang_preemption)
        if victims:
            _preempt(state, victims, config, "las", pending.job_id)
            return [pending.job_id]
    return []
