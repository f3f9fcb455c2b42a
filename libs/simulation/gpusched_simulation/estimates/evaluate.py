"""At sampled instants of a replay (``whatif.engine``, the live cores), every waiting job's estimate from the
estimator core (``gpusched_core.estimates``) on what was known then: the nodes, the runs (since when, on
which GPUs), the waiting jobs in the quota cycle's own order (``quota.positions.rank_cohort``), the runs that
had ended (a trace without time limits: the tenants' past run-times); later held against its actual start.
The same with every run-time known (``oracle``) says how much of the error is the run-times' and how much
arrivals and reordering after the instant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpusched_core.estimates import EstimateConfig, FinishedRun, Hold, NodeGpus, RunningJob, Shape, WaitingJob
from gpusched_core.estimates import plan_estimates
from gpusched_core.quota import Tenancy
from gpusched_core.quota.jobs import QueuedJob, cohort_of
from gpusched_core.quota.positions import rank_cohort

from ..queue.cluster import gang_shape
from ..whatif.cluster import ReplayNode
from ..whatif.engine import Replay, ReplayJob, replay
from ..whatif.report import percentile

WAIT_BUCKETS = ((0.0, 600.0, "< 10 min"), (600.0, 3600.0, "10 min - 1 h"), (3600.0, 6 * 3600.0, "1 - 6 h"),
                (6 * 3600.0, float("inf"), ">= 6 h"))


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    job_id: str
    estimated_start_s: float | None
    oracle_start_s: float | None
    runtime_source: str


@dataclass
class Collector:
    tenancy: Tenancy
    nodes: tuple[NodeGpus, ...]
    per_node: int
    config: EstimateConfig = field(default_factory=EstimateConfig)
    before: tuple[FinishedRun, ...] = ()  # runs of before the replay (each counts once it has ended)
    samples: list[Sample] = field(default_factory=list)

    def __call__(self, state: Replay, at_s: float) -> None:
        waiting = self.queue(state, at_s)
        if not waiting:
            return
        finished = [*self.before, *(FinishedRun(o.job.tenant, float(o.job.gpus), None, o.job.runtime_s, o.end_s)
                                    for o in state.outcomes.values() if o.end_s is not None and o.end_s <= at_s)]
        running = [self.run(state, job_id) for job_id in state.running]
        known = plan_estimates(self.nodes, running, waiting, finished, at_s, self.tenancy, self.config)
        oracle = plan_estimates(self.nodes, [self.run(state, j, True) for j in state.running],
                                [self.wait(state, w.job_id, w.position, True) for w in waiting], (), at_s,
                                self.tenancy, self.config)
        self.samples += [Sample(at_s, k.job_id, k.start_s, o.start_s, k.runtime_source)
                         for k, o in zip(known, oracle, strict=True)]

    def queue(self, state: Replay, at_s: float) -> list[WaitingJob]:
        """The waiting jobs in the quota cycle's order, cohort by cohort (as ``stores.quota.quota_queue``)."""
        queued = [QueuedJob(job_id, state.outcomes[job_id].job.tenant, state.outcomes[job_id].job.gpus, None,
                            state.outcomes[job_id].job.priority, state.outcomes[job_id].job.submit_s)
                  for job_id in state.pending]
        out = []
        for cohort in sorted({cohort_of(self.tenancy, q.tenant) for q in queued}):
            mine = [q for q in queued if cohort_of(self.tenancy, q.tenant) == cohort]
            for entry in rank_cohort(self.tenancy, cohort, state.usage, state.history, mine, at_s):
                out.append(self.wait(state, entry.job_id, entry.position))
        return out

    def wait(self, state: Replay, job_id: str, position: int | None, oracle: bool = False) -> WaitingJob:
        job = state.outcomes[job_id].job
        members, each = gang_shape(job.gpus, self.per_node)
        return WaitingJob(job_id, job.tenant, Shape(each, members), job.submit_s, job.priority, position,
                          job.runtime_s if oracle else None)

    def run(self, state: Replay, job_id: str, oracle: bool = False) -> RunningJob:
        outcome = state.outcomes[job_id]
        holds = tuple(Hold(str(b.node_id), i) for b in state.cluster.bindings[job_id] for i in b.gpu_indices)
        members, each = gang_shape(outcome.job.gpus, self.per_node)
        return RunningJob(job_id, outcome.job.tenant, Shape(each, members), outcome.start_s or 0.0, holds,
                          outcome.job.runtime_s if oracle else None)


def evaluate(jobs: Sequence[ReplayJob], nodes: Sequence[ReplayNode], tenancy: Tenancy, every_s: float,
             placement: str = "bestfit", config: EstimateConfig = EstimateConfig(),
             before: Sequence[FinishedRun] = ()) -> tuple[Replay, list[Sample]]:
    """Replay ``jobs`` and estimate every ``every_s`` from the first arrival to the last; ``before``: the runs
    of the trace before the replay's window, what the estimator knows of the past at its start."""
    collector = Collector(tenancy, tuple(NodeGpus(n.node_id, n.model, tuple(range(n.gpus))) for n in nodes),
                          max(n.gpus for n in nodes), config, tuple(before))
    first, last = min(j.submit_s for j in jobs), max(j.submit_s for j in jobs)
    instants = [first + every_s * k for k in range(1, int((last - first) // every_s) + 1)]
    state = replay(jobs, nodes, placement, tenancy, fragmentation=False, observe=collector, observe_at_s=instants)
    return state, collector.samples


def accuracy(state: Replay, samples: Sequence[Sample], oracle: bool = False) -> dict:
    """Median and p90 absolute error (s) overall and by the actual wait left at the instant; how many
    estimates were unknown, and how many jobs never started in the replay."""
    rows = []
    unknown = 0
    for s in samples:
        actual = state.outcomes[s.job_id].start_s
        estimate = s.oracle_start_s if oracle else s.estimated_start_s
        if estimate is None or actual is None:
            unknown += 1
            continue
        rows.append((actual - s.at_s, abs(estimate - actual), estimate - actual))
    out = {"estimates": len(samples), "unknown": unknown, "overall": _errors(rows), "by_wait": {}}
    for low, high, label in WAIT_BUCKETS:
        out["by_wait"][label] = _errors([r for r in rows if low <= r[0] < high])
    return out


def _errors(rows: list[tuple[float, float, float]]) -> dict:
    errors = [r[1] for r in rows]
    optimistic = sum(1 for r in rows if r[2] < 0)  # it started later than estimated
    return {"n": len(rows), "median_abs_error_s": percentile(errors, 50), "p90_abs_error_s": percentile(errors, 90),
            "optimistic_pct": 100.0 * optimistic / len(rows) if rows else None}
