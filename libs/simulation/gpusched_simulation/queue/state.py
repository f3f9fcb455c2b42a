"""Mutable state of one simulated run: the clock, queues, running jobs, quota usage and records.

Only the engine and the preemption helpers change it; the decisions themselves come from the pure
quota core (``gpusched_core.quota``) and the placement core (through ``cluster``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

from gpusched_core.quota import (
    UNITS_PER_GPU,
    JobOrder,
    PendingJob,
    PendingQueue,
    QuotaAsk,
    Tenancy,
    UsageHistory,
    advance,
    rate_geq,
)

from ..clock import EventQueue
from ..traces.philly import TraceJob
from .cluster import FLAVOR, Binding, Cluster

PRIORITY_CLASS = "batch"
FINISH = 0  # the one kind of event: a run's end


@dataclass(slots=True)
class JobState:
    job: TraceJob
    remaining_s: float  # work left, in seconds of running
    attained_gpu_s: float = 0.0
    preemptions: int = 0
    completed_s: float | None = None


@dataclass(slots=True)
class Run:
    job_id: str
    tenant: str
    units: int
    start_s: float
    end_s: float
    overhead_s: float  # the first seconds of a resumed run restore a checkpoint: no progress
    bindings: tuple[Binding, ...]


@dataclass
class SimState:
    tenancy: Tenancy
    cluster: Cluster
    order: JobOrder
    now_s: float = 0.0
    jobs: dict[str, JobState] = field(default_factory=dict)
    queues: dict[str, list[tuple[tuple, PendingJob]]] = field(default_factory=dict)
    sizes: dict[str, Counter] = field(default_factory=dict)
    running: dict[str, Run] = field(default_factory=dict)
    completions: EventQueue = field(default_factory=EventQueue)  # each run's end, stamped with its epoch
    epochs: dict[str, int] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    history: dict[str, UsageHistory] = field(default_factory=dict)
    runs: list[tuple[str, float, float, int]] = field(default_factory=list)  # tenant, start, end, gpus
    overhead_s: float = 60.0  # checkpoint restore time of a resumed job
    max_overshoot_units: int = 0
    preemptions: int = 0
    preemption_causes: Counter = field(default_factory=Counter)  # "las own tenant", "reclaim", ...: victims
    restore_gpu_s: float = 0.0  # GPU-seconds resumed runs spent restoring a checkpoint: preemption's lost work

    # --- queues ---------------------------------------------------------------------------------

    def enqueue(self, job_id: str, level: int) -> None:
        state = self.jobs[job_id]
        job = state.job
        pending = PendingJob(job_id, job.tenant, QuotaAsk(((FLAVOR, job.gpus * UNITS_PER_GPU),)), PRIORITY_CLASS,
                             job.arrival_s, level)
        key = self.order.tenant_key(pending, self.tenancy.priority_classes[PRIORITY_CLASS])
        bisect.insort(self.queues.setdefault(job.tenant, []), (key, pending))
        self.sizes.setdefault(job.tenant, Counter())[job.gpus * UNITS_PER_GPU] += 1

    def dequeue(self, pending: PendingJob, key: tuple) -> None:
        entries = self.queues[pending.tenant]
        del entries[bisect.bisect_left(entries, (key,))]
        sizes = self.sizes[pending.tenant]
        sizes[pending.ask.units] -= 1
        if not sizes[pending.ask.units]:
            del sizes[pending.ask.units]

    def pending_queues(self) -> list[PendingQueue]:
        return [PendingQueue(tenant, FLAVOR, entries, min(self.sizes[tenant]), max(self.sizes[tenant]), True)
                for tenant, entries in sorted(self.queues.items()) if entries]

    def pending_count(self) -> int:
        return sum(len(entries) for entries in self.queues.values())

    # --- quota usage ----------------------------------------------------------------------------

    def advance_history(self, now_s: float) -> None:
        """Decay every tenant's history to ``now_s`` at the rate it held since the last event."""
        half_life = self.tenancy.half_life_s
        if half_life <= 0:
            return
        for tenant in self.tenancy.leaves():
            past = self.history.get(tenant) or UsageHistory(now_s)
            self.history[tenant] = advance(past, now_s, rate_geq(self.tenancy, self.usage.get(tenant, {})), half_life)

    def charge(self, tenant: str, units: int) -> None:
        row = self.usage.setdefault(tenant, {})
        row[FLAVOR] = row.get(FLAVOR, 0) + units
        spec = self.tenancy.tenants[tenant].flavor_quota(FLAVOR)
        if spec.borrowing_limit is not None:
            over = row[FLAVOR] - spec.nominal - spec.borrowing_limit
            self.max_overshoot_units = max(self.max_overshoot_units, over)
        root = self.tenancy.root_of(tenant)
        pool = self.tenancy.tree.pool[FLAVOR][self.tenancy.tree.index[root]]
        total = sum(r.get(FLAVOR, 0) for r in self.usage.values())
        self.max_overshoot_units = max(self.max_overshoot_units, total - pool)

    def used(self, tenant: str) -> int:
        return self.usage.get(tenant, {}).get(FLAVOR, 0)

    # --- running --------------------------------------------------------------------------------

    def start(self, job_id: str, units: int, bindings: tuple[Binding, ...]) -> None:
        state = self.jobs[job_id]
        overhead = self.overhead_s if state.preemptions else 0.0
        end = self.now_s + overhead + state.remaining_s
        self.running[job_id] = Run(job_id, state.job.tenant, units, self.now_s, end, overhead, bindings)
        self.epochs[job_id] = self.epochs.get(job_id, 0) + 1
        self.completions.push(end, FINISH, job_id, self.epochs[job_id])
        self.charge(state.job.tenant, units)

    def stop(self, job_id: str) -> Run:
        """End a run now (completion or preemption): free GPUs and quota, record the interval."""
        run = self.running.pop(job_id)
        state = self.jobs[job_id]
        ran = self.now_s - run.start_s
        state.remaining_s = max(0.0, state.remaining_s - max(0.0, ran - run.overhead_s))
        state.attained_gpu_s += ran * state.job.gpus
        self.restore_gpu_s += min(ran, run.overhead_s) * state.job.gpus
        self.cluster.release(job_id, run.bindings)
        self.charge(run.tenant, -run.units)
        self.runs.append((run.tenant, run.start_s, self.now_s, state.job.gpus))
        return run

    def attained(self, run: Run) -> float:
        state = self.jobs[run.job_id]
        return state.attained_gpu_s + (self.now_s - run.start_s) * state.job.gpus
