"""The what-if replay: recorded submissions (real run-times, shapes, tenants, priorities, submit times)
through today's nodes, a placement policy by name and, given a tenancy, the quota core.

At every event time (an arrival, a run's end, a preempted run back in the queue): decay the tenants'
usage histories, end the runs due, enqueue the arrivals, then schedule. With a tenancy, one quota cycle
(``QuotaCycle``, fair-share order) walks the pending jobs; each that fits quota is placed by the placement
engine on its flavor's model or deferred (as the queue simulator does, on a mix of models). Without one,
pending jobs are placed in placement's order (priority, then submission).

A job that cannot be placed asks the live victim selection (``preempt``: ``preemption.select_victims``, a
priority trigger, the live service's minimum run-time and cross-tenant rule). Its victims hold their GPUs
through the grace period, then stop and queue again (their work is lost: a rerun takes the whole
run-time); the job holds its quota from now, and is placed first when its last victim has stopped. ``observe(replay, at_s)`` is called at each instant of
``observe_at_s`` with the state as it stood then (``simulate-estimates`` estimates from it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpusched_core import placement as engine
from gpusched_core.quota import (FairShareOrder, GpuAsk, PendingJob, QuotaBook, QuotaCycle, QuotaSnapshot, Tenancy,
                                 UnitError, UsageHistory, advance, build_queues, pending_job, rate_geq)
from gpusched_core.quota.backfill import FairBackfill
from gpusched_core.quota.jobs import limit_units, priority_class_for

from .cluster import ReplayCluster, ReplayNode
from .events import EventQueue
from .preempt import PreemptionSettings, fair_victims_for, victims_for

FINISH, STOP = 0, 1


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """A recorded submission: ``gpus`` in all (a gang's over its nodes), the model asked for (None: any)."""

    job_id: str
    tenant: str
    gpus: int
    model: str | None
    priority: int
    submit_s: float
    runtime_s: float


@dataclass(slots=True)
class Outcome:
    job: ReplayJob
    start_s: float | None = None
    end_s: float | None = None
    unschedulable: str | None = None  # why it could never run here
    preempted: int = 0  # times it was preempted
    lost_gpu_s: float = 0.0  # GPU-seconds of work its preemptions threw away

    @property
    def wait_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.job.submit_s


@dataclass(slots=True)
class Run:
    """A job holding GPUs: what quota charges it, when this run began (after a preemptor's grace, perhaps),
    and the run's ``epoch`` (its end event must match)."""

    tenant: str
    flavor: str
    units: int
    start_s: float
    epoch: int
    stopping_for: str | None = None  # preempted: it stops at ``stop_at_s`` (the grace's end), for this job
    stop_at_s: float = 0.0


@dataclass
class Replay:
    cluster: ReplayCluster
    tenancy: Tenancy | None
    workload: engine.WorkloadDistribution | None = None  # fragmentation is measured against it (None: not)
    now_s: float = 0.0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    pending: dict[str, PendingJob | ReplayJob] = field(default_factory=dict)  # arrival order
    running: dict[str, Run] = field(default_factory=dict)
    queued: dict[str, PendingJob | ReplayJob] = field(default_factory=dict)  # each job as it (re)joins the queue
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    history: dict[str, UsageHistory] = field(default_factory=dict)
    ends: EventQueue = field(default_factory=EventQueue)
    allocated_gpu_s: float = 0.0
    fragmented_pct_s: float = 0.0
    max_overshoot_units: int = 0
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    epochs: int = 0
    refused: set[tuple[int, int, str]] = field(default_factory=set)  # shapes no victims were found for now
    refused_fair: set[tuple[str, int, int, str]] = field(default_factory=set)  # the same, by fair share
    refused_places: set[tuple[int, str]] = field(default_factory=set)  # shapes no room was found for now
    awaiting: dict[str, tuple[tuple[str, str, int], set[str]]] = field(default_factory=dict)  # job -> charge, victims

    # --- queueing ---------------------------------------------------------------------------

    def arrive(self, job: ReplayJob) -> None:
        outcome = self.outcomes[job.job_id] = Outcome(job)
        models = (job.model,) if job.model else self.cluster.models
        if not self.cluster.could_ever_fit(job.gpus, models):
            outcome.unschedulable = f"no {job.gpus}-GPU room of {', '.join(models)} on these nodes"
            return
        if self.tenancy is None:
            self.pending[job.job_id] = self.queued[job.job_id] = job
            return
        charged = self.tenancy.charged_tenant(job.tenant)
        if charged not in self.tenancy.tenants or not self.tenancy.tenants[charged].is_leaf:
            outcome.unschedulable = f"tenant {job.tenant} is not a team of the tenancy"
            return
        ask = GpuAsk(gpus=job.gpus, models=(job.model,) if job.model else ())
        try:
            pending = pending_job(self.tenancy, job.job_id, charged, ask, job.submit_s,
                                  priority_class_for(self.tenancy, job.priority))
        except UnitError as exc:
            outcome.unschedulable = str(exc)
            return
        book = QuotaBook.from_usage(self.tenancy, {})
        if not any(units <= book.most_ever(charged, flavor) and self.cluster.could_ever_fit(job.gpus, (flavor,))
                   for flavor, units in pending.ask.options):
            outcome.unschedulable = f"more than tenant {job.tenant} may ever hold, or no room of its models"
            return
        self.pending[job.job_id] = self.queued[job.job_id] = pending

    def _place(self, job_id: str, gpus: int, model: str) -> bool:
        """Place the job, or say no; a shape that found no room in this pass is not tried again in it (nothing
        is released within a pass, so it would find none: the same answers, far fewer placements)."""
        if (gpus, model) in self.refused_places or not self.cluster.place(job_id, gpus, model):
            self.refused_places.add((gpus, model))
            return False
        return True

    def schedule(self) -> None:
        self.refused.clear()
        self.refused_fair.clear()
        self.refused_places.clear()
        if not self.pending:
            return
        if self.tenancy is None:
            lowest = self._lowest_preemptible()
            for job in sorted(self.pending.values(), key=lambda j: (-j.priority, j.submit_s, j.job_id)):
                models = (job.model,) if job.model else self.cluster.models
                model = next((m for m in models if self._place(job.job_id, job.gpus, m)), None)
                if model is not None:
                    self._start(job.job_id, (job.tenant, model, 0))
                    continue
                if lowest is None or job.priority <= lowest:
                    continue  # no run it could preempt
                for m in models:
                    if (plan := victims_for(self, job.job_id, job.tenant, job.priority, job.gpus, m)) is not None:
                        self._preempt_for(job.job_id, (job.tenant, m, 0), plan)
                        lowest = self._lowest_preemptible()
                        break
            return
        queues = build_queues(self.tenancy, [p for p in self.pending.values() if isinstance(p, PendingJob)],
                              FairShareOrder())
        snapshot = QuotaSnapshot(self.tenancy, self.usage, self.history, self.now_s)
        margin = self.preemption.fair_margin
        backfill = FairBackfill(snapshot, queues, margin) if margin is not None else None  # shares, demand
        holding = backfill is not None and self.preemption.fair_backfill
        cycle = QuotaCycle(snapshot, queues, FairShareOrder(), explain=False,
                           shares=backfill.shares if backfill is not None else None)
        lowest = self._lowest_preemptible()
        while lowest is not None or self.cluster.allocated < self.cluster.capacity:
            if (candidate := cycle.next_candidate()) is None:
                break
            job = self.outcomes[candidate.job.job_id].job
            if self.cluster.allocated >= self.cluster.capacity and (lowest is None or job.priority < lowest):
                cycle.defer(candidate)  # nothing is free and it may preempt no run (fair share: none of its priority)
                continue
            if holding and backfill.holds_back(candidate.job, candidate.flavor, candidate.units):
                cycle.defer(candidate)  # fair backfill: another tenant's job waits for room (as live quota)
                continue
            if candidate.flavor in self.cluster.per_node and self._place(job.job_id, job.gpus, candidate.flavor):
                reservation = cycle.reserve(candidate)
                self._start(job.job_id, (candidate.job.tenant, reservation.flavor, reservation.units))
                if holding:
                    backfill.started(candidate.job.tenant, candidate.flavor, reservation.units)
                continue
            plan = None if candidate.flavor not in self.cluster.per_node or lowest is None or \
                job.priority <= lowest else victims_for(
                self, job.job_id, candidate.job.tenant, job.priority, job.gpus, candidate.flavor)
            if plan is None and backfill is not None and candidate.flavor in self.cluster.per_node:
                plan = fair_victims_for(self, backfill.demand, job.job_id, candidate.job.tenant, job.priority,
                                        candidate.units, job.gpus, candidate.flavor)
            if plan is None:
                cycle.defer(candidate)
                if holding:
                    backfill.blocked(candidate.job, candidate.flavor, candidate.units)
                continue
            reservation = cycle.reserve(candidate)
            self._preempt_for(job.job_id, (candidate.job.tenant, reservation.flavor, reservation.units), plan)
            lowest = self._lowest_preemptible()
        cycle.finish()

    def _lowest_preemptible(self) -> int | None:
        """The lowest priority of a run old enough to be preempted (None: none is, or preemption is off)."""
        if not self.preemption.enabled:
            return None
        oldest = self.now_s - self.preemption.min_runtime_s
        return min((self.outcomes[j].job.priority for j, run in self.running.items()
                    if run.start_s <= oldest and run.stopping_for is None), default=None)

    def _preempt_for(self, job_id: str, charge: tuple[str, str, int], plan) -> None:
        """Ask ``plan``'s victims to stop (each holds its GPUs until the grace ends); the job leaves the queue,
        holds its quota, and is placed when the last of them has stopped (``_stopped``)."""
        stop_at = self.now_s + self.preemption.grace_s
        for victim in plan.victims:
            run = self.running[victim.job_id]
            run.stopping_for, run.stop_at_s = job_id, stop_at
            self._lose(victim.job_id, run, stop_at, 1)
            self.ends.push(stop_at, STOP, victim.job_id, run.epoch)
        del self.pending[job_id]
        self._charge(charge, 1)
        self.awaiting[job_id] = (charge, {v.job_id for v in plan.victims})

    def _lose(self, job_id: str, run: Run, stop_at: float, sign: int) -> None:
        """Count (``sign`` 1) or take back (-1: it ended by itself in its grace) a preemption and its lost work."""
        outcome = self.outcomes[job_id]
        lost = sign * outcome.job.gpus * max(0.0, stop_at - run.start_s)
        outcome.preempted += sign
        outcome.lost_gpu_s += lost
        self.preemptions += sign
        self.lost_gpu_s += lost

    def _stopped(self, job_id: str, run: Run, preempted: bool) -> None:
        """A victim is off its GPUs (stopped, or it ended in its grace): the job it stopped for is placed once
        none of its victims is left (back in the queue, its quota given back, should the slot be gone)."""
        waiting_for = run.stopping_for
        if preempted:
            self.pending[job_id] = self.queued[job_id]  # back in the queue, as submitted
        if waiting_for is None or waiting_for not in self.awaiting:
            return
        charge, victims = self.awaiting[waiting_for]
        victims.discard(job_id)
        if victims:
            return
        del self.awaiting[waiting_for]
        self.pending[waiting_for] = self.queued[waiting_for]
        if self.cluster.place(waiting_for, self.outcomes[waiting_for].job.gpus, charge[1]):
            self._start(waiting_for, charge, charged=True)
        else:
            self._charge(charge, -1)

    def _start(self, job_id: str, charge: tuple[str, str, int], charged: bool = False) -> None:
        del self.pending[job_id]
        outcome = self.outcomes[job_id]
        if outcome.start_s is None:
            outcome.start_s = self.now_s  # its wait is until it first ran
        self.epochs += 1
        self.running[job_id] = Run(*charge, self.now_s, self.epochs)
        self.ends.push(self.now_s + outcome.job.runtime_s, FINISH, job_id, self.epochs)
        if not charged:
            self._charge(charge, 1)

    def _charge(self, charge: tuple[str, str, int], sign: int) -> None:
        tenant, flavor, units = charge
        if self.tenancy is None or not units:
            return
        row = self.usage.setdefault(tenant, {})
        row[flavor] = row.get(flavor, 0) + sign * units
        limit = limit_units(self.tenancy, tenant, flavor)
        if limit is not None:
            self.max_overshoot_units = max(self.max_overshoot_units, row[flavor] - limit)

    def finish_due(self) -> None:
        for end in self.ends.pop_due(self.now_s):
            run = self.running.get(end.item_id)
            if run is None or run.epoch != end.epoch:
                continue  # the end of a run that was preempted
            self.cluster.release(end.item_id)
            del self.running[end.item_id]
            self._charge((run.tenant, run.flavor, run.units), -1)
            if end.kind == FINISH:
                self.outcomes[end.item_id].end_s = self.now_s
                if run.stopping_for is not None:  # it ended by itself within its grace: not preempted after all
                    self._lose(end.item_id, run, run.stop_at_s, -1)
            self._stopped(end.item_id, run, preempted=end.kind == STOP)

    def advance_to(self, now_s: float) -> None:
        """Accrue the time-weighted figures and the usage histories up to ``now_s``."""
        span = now_s - self.now_s
        if span > 0:
            self.allocated_gpu_s += span * self.cluster.allocated
            if self.workload is not None:
                self.fragmented_pct_s += span * self.cluster.fragmentation_pct(self.workload)
        if self.tenancy is not None and self.tenancy.half_life_s > 0:
            for tenant in self.tenancy.leaves():
                past = self.history.get(tenant) or UsageHistory(now_s)
                self.history[tenant] = advance(past, now_s, rate_geq(self.tenancy, self.usage.get(tenant, {})),
                                               self.tenancy.half_life_s)
        self.now_s = now_s


Observer = Callable[[Replay, float], None]
CHECK_EVERY = 256  # event times between two looks at ``stop``


class Stopped(Exception):
    """The caller's ``stop`` said so (a what-if past its deadline): the replay was left unfinished."""


def replay(jobs: Iterable[ReplayJob], nodes: Sequence[ReplayNode], placement: str, tenancy: Tenancy | None = None,
           *, fragmentation: bool = True, observe: Observer | None = None, observe_at_s: Sequence[float] = (),
           preemption: PreemptionSettings = PreemptionSettings(),
           stop: Callable[[], bool] | None = None) -> Replay:
    """Every job to its end (or unschedulable); the final state. ``stop``: asked now and then whether to give
    up (``Stopped``), so that a caller with a deadline does not leave a replay running."""
    ordered = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    workload = _workload(ordered, nodes) if fragmentation else None
    state = Replay(ReplayCluster(nodes, placement, workload), tenancy, workload, preemption=preemption)
    state.now_s = ordered[0].submit_s if ordered else 0.0
    samples = sorted(observe_at_s)
    i = k = steps = 0
    while True:
        steps += 1
        if stop is not None and steps % CHECK_EVERY == 0 and stop():
            raise Stopped(f"stopped after {steps} event times")
        now = min(ordered[i].submit_s if i < len(ordered) else math.inf, state.ends.next_at())
        while observe is not None and k < len(samples) and samples[k] < now:
            observe(state, samples[k])  # nothing changed since the last event: this is the state then
            k += 1
        if now == math.inf:
            return state
        state.advance_to(now)
        state.finish_due()
        while i < len(ordered) and ordered[i].submit_s <= now:
            state.arrive(ordered[i])
            i += 1
        state.schedule()


def _workload(jobs: Sequence[ReplayJob], nodes: Sequence[ReplayNode]) -> engine.WorkloadDistribution | None:
    """The replayed requests' own distribution (what FGD measures fragmentation against)."""
    largest = max((n.gpus for n in nodes), default=0)
    requests = [engine.PodRequest(id=engine.RequestId(j.job_id), gpu=engine.WholeGpus(j.gpus))
                for j in jobs if 0 < j.gpus <= largest]
    return engine.workload_from_requests(requests) if requests else None
