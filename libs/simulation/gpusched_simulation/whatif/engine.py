"""The what-if replay: recorded submissions (real run-times, shapes, tenants, priorities, submit times)
through today's nodes, a placement policy by name and, given a tenancy, the quota core.

At every event time (an arrival, a run's end): decay the tenants' usage histories, end the runs due,
enqueue the arrivals, then schedule. With a tenancy, one quota cycle (``QuotaCycle``, fair-share order)
walks the pending jobs; each that fits quota is placed by the placement engine on its flavor's model or
deferred (as ``queue.engine`` does, on a mix of models). Without one, pending jobs are placed in
placement's order (priority, then submission). Nothing is preempted: the replay answers what the policy and
the quotas change, not what preemption would. ``observe(replay, at_s)`` is called at each instant of
``observe_at_s`` with the state as it stood then (``simulate-estimates`` estimates from it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gpusched_core import placement as engine
from gpusched_core.quota import (FairShareOrder, GpuAsk, PendingJob, QuotaBook, QuotaCycle, QuotaSnapshot, Tenancy,
                                 UnitError, UsageHistory, advance, build_queues, pending_job, rate_geq)
from gpusched_core.quota.jobs import limit_units, priority_class_for

from ..clock import EventQueue
from .cluster import ReplayCluster, ReplayNode

FINISH = 0


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

    @property
    def wait_s(self) -> float | None:
        return None if self.start_s is None else self.start_s - self.job.submit_s


@dataclass
class Replay:
    cluster: ReplayCluster
    tenancy: Tenancy | None
    workload: engine.WorkloadDistribution | None = None  # fragmentation is measured against it (None: not)
    now_s: float = 0.0
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    pending: dict[str, PendingJob | ReplayJob] = field(default_factory=dict)  # arrival order
    running: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # job -> (tenant, flavor, units)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    history: dict[str, UsageHistory] = field(default_factory=dict)
    ends: EventQueue = field(default_factory=EventQueue)
    allocated_gpu_s: float = 0.0
    fragmented_pct_s: float = 0.0
    max_overshoot_units: int = 0
    preemptions: int = 0

    # --- queueing ---------------------------------------------------------------------------

    def arrive(self, job: ReplayJob) -> None:
        outcome = self.outcomes[job.job_id] = Outcome(job)
        models = (job.model,) if job.model else self.cluster.models
        if not self.cluster.could_ever_fit(job.gpus, models):
            outcome.unschedulable = f"no {job.gpus}-GPU room of {', '.join(models)} on these nodes"
            return
        if self.tenancy is None:
            self.pending[job.job_id] = job
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
        self.pending[job.job_id] = pending

    def schedule(self) -> None:
        if not self.pending:
            return
        if self.tenancy is None:
            for job in sorted(self.pending.values(), key=lambda j: (-j.priority, j.submit_s, j.job_id)):
                models = (job.model,) if job.model else self.cluster.models
                model = next((m for m in models if self.cluster.place(job.job_id, job.gpus, m)), None)
                if model is not None:
                    self._start(job.job_id, (job.tenant, model, 0))
            return
        queues = build_queues(self.tenancy, [p for p in self.pending.values() if isinstance(p, PendingJob)],
                              FairShareOrder())
        cycle = QuotaCycle(QuotaSnapshot(self.tenancy, self.usage, self.history, self.now_s), queues,
                           FairShareOrder(), explain=False)
        while self.cluster.allocated < self.cluster.capacity and (candidate := cycle.next_candidate()) is not None:
            gpus = self.outcomes[candidate.job.job_id].job.gpus
            if candidate.flavor not in self.cluster.per_node or not self.cluster.place(candidate.job.job_id, gpus,
                                                                                        candidate.flavor):
                cycle.defer(candidate)
                continue
            reservation = cycle.reserve(candidate)
            self._start(candidate.job.job_id, (candidate.job.tenant, reservation.flavor, reservation.units))
        cycle.finish()

    def _start(self, job_id: str, charge: tuple[str, str, int]) -> None:
        del self.pending[job_id]
        outcome = self.outcomes[job_id]
        outcome.start_s = self.now_s
        self.running[job_id] = charge
        self.ends.push(self.now_s + outcome.job.runtime_s, FINISH, job_id)
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
            self.cluster.release(end.item_id)
            self._charge(self.running.pop(end.item_id), -1)
            self.outcomes[end.item_id].end_s = self.now_s

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


def replay(jobs: Iterable[ReplayJob], nodes: Sequence[ReplayNode], placement: str, tenancy: Tenancy | None = None,
           *, fragmentation: bool = True, observe: Observer | None = None,
           observe_at_s: Sequence[float] = ()) -> Replay:
    """Every job to its end (or unschedulable); the final state."""
    ordered = sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    workload = _workload(ordered, nodes) if fragmentation else None
    state = Replay(ReplayCluster(nodes, placement, workload), tenancy, workload)
    state.now_s = ordered[0].submit_s if ordered else 0.0
    samples = sorted(observe_at_s)
    i = k = 0
    while True:
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
