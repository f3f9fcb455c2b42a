"""The campaign's checker (pure): the whole system's invariants, from the event store and the runs' own
records (``runjob``), for every job the gateway acknowledged.

- **lost**: acknowledged, yet the store has no such job;
- **stuck**: not ended when the campaign's drain ran out (every campaign job is finite);
- **double runs**: two runs of one job alive at the same time that are not one gang run (different
  attempts, or one attempt twice on a node, or a job of one node on two);
- **double-allocated GPU-seconds**: time a GPU (or MIG device) was held beyond itself: two whole-GPU runs,
  or shares adding up past the whole GPU;
- **quota overshoot**: a tenant's reservation beyond its nominal quota plus its borrowing limit, or a cohort's
  beyond its total, in units (1,000 per GPU);
- **stale reports applied**: a job whose recorded end is not what its last run did (no run of that attempt
  on that node, or one that did not end so: an exit report of another run or epoch was believed).

A run is known alive from its start to the last time its file was touched (or its own end): a run killed
by SIGKILL ended after that, so an overlap found is certain, never a guess.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from gpusched_core.quota.units import UNITS_PER_GPU as SERVICE_UNITS_PER_GPU

UNITS_PER_GPU = 1000


@dataclass(frozen=True)
class Run:
    job_id: str
    attempt: int | None
    node: str
    pid: int
    start: float
    alive_until: float  # its own end, or the last time it was seen alive
    exit_code: int | None  # None: it did not end by itself (killed)
    devices: tuple[str, ...]
    share_milli: int | None


@dataclass(frozen=True)
class JobFact:
    job_id: str
    status: str | None  # None: the store has no such job
    nodes: int = 1  # the spec's node count (a gang's members run at once)
    attempts: int = 0  # how many times it was placed (its last run's attempt)
    end_exit_code: int | None = None  # the exit code its end records (Succeeded, Failed by its code)
    end_nodes: tuple[str, ...] = ()  # the nodes of its last run


@dataclass(frozen=True)
class QuotaPoint:
    position: int  # the event's place in the store's global order
    tenant: str
    flavor: str  # the GPU model charged
    reserved_gpus: float  # the tenant's reservation of that model after this event
    job_id: str = ""  # the job whose reservation or release this event is


@dataclass(frozen=True)
class QuotaLimits:
    tenants: dict[tuple[str, str], float]  # (tenant, model) -> nominal + borrowing limit (or the cohort's total)
    cohorts: dict[tuple[str, str], float]  # (cohort, model) -> the cohort's total nominal quota
    cohort_of: dict[str, str]


@dataclass
class Report:
    jobs: int
    faults: int
    faults_by_kind: dict[str, int]
    lost_jobs: int
    double_runs: int
    double_allocated_gpu_seconds: float
    quota_overshoot_units: int
    stale_reports_applied: int
    stuck_jobs: int
    recovery_p50_s: float | None
    recovery_p99_s: float | None
    seed: int
    unpublished_outbox_rows: int = 0
    unexpected_failures: int = 0  # jobs Failed that were to succeed (reported, not an invariant of the issue)
    quota_held_at_end_units: int = 0  # reserved after every job ended: a lost release
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not (self.lost_jobs or self.double_runs or self.double_allocated_gpu_seconds or self.quota_overshoot_units
                    or self.stale_reports_applied or self.stuck_jobs or self.unpublished_outbox_rows
                    or self.quota_held_at_end_units)


TERMINAL = frozenset({"Succeeded", "Failed", "Cancelled", "Rejected"})
SIGNALLED = frozenset({137, 143, -9, -15})


def lost_and_stuck(acknowledged: list[str], facts: dict[str, JobFact]) -> tuple[list[str], list[str]]:
    lost = [j for j in acknowledged if facts.get(j) is None or facts[j].status is None]
    stuck = [j for j in acknowledged if j not in lost and facts[j].status not in TERMINAL]
    return lost, stuck


def double_runs(runs: list[Run], facts: dict[str, JobFact]) -> list[str]:
    """Pairs of runs of one job alive together that are no gang run (described)."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    found = []
    for job_id, job_runs in sorted(by_job.items()):
        gang = (facts.get(job_id) or JobFact(job_id, None)).nodes > 1
        job_runs.sort(key=lambda r: r.start)
        for i, a in enumerate(job_runs):
            for b in job_runs[i + 1:]:
                if b.start >= a.alive_until:
                    continue
                one_gang_run = gang and a.attempt == b.attempt and a.node != b.node
                if not one_gang_run:
                    found.append(f"{job_id}: attempt {a.attempt} on {a.node} (pid {a.pid}) and attempt {b.attempt} "
                                 f"on {b.node} (pid {b.pid}) alive together for {a.alive_until - b.start:.2f} s")
    return found


def double_allocated_seconds(runs: list[Run]) -> tuple[float, list[str]]:
    """Seconds a device was held past itself, summed over devices (a whole GPU or MIG device weighs 1,000,
    a share its milli)."""
    by_device: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for run in runs:
        weight = run.share_milli if run.share_milli else UNITS_PER_GPU
        for device in run.devices:
            key = f"{run.node}:{device}"
            by_device[key].append((run.start, weight))
            by_device[key].append((run.alive_until, -weight))
    total, examples = 0.0, []
    for device, edges in sorted(by_device.items()):
        edges.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
        held, since, over = 0, 0.0, 0.0
        for at, delta in edges:
            if held > UNITS_PER_GPU:
                over += at - since
            held += delta
            since = at
        if over > 0:
            total += over
            examples.append(f"{device}: over-allocated for {over:.2f} s")
    return round(total, 3), examples


def quota_overshoot(points: list[QuotaPoint], limits: QuotaLimits) -> tuple[int, list[str]]:
    """Units beyond a tenant's nominal + borrowing for a model (at its worst moment), and beyond its cohort's
    total. Reservations are compared in whole GPUs, as the events record them. An example names the event
    of the worst moment and what each tenant held then."""
    worst: dict[tuple[str, str], tuple[float, QuotaPoint]] = {}
    current: dict[tuple[str, str], float] = {}
    cohort_worst: dict[tuple[str, str], tuple[float, QuotaPoint, str]] = {}
    for point in sorted(points, key=lambda p: p.position):
        key = (point.tenant, point.flavor)
        current[key] = point.reserved_gpus
        if point.reserved_gpus > worst.get(key, (0.0, point))[0]:
            worst[key] = (point.reserved_gpus, point)
        cohort = (limits.cohort_of.get(point.tenant, point.tenant), point.flavor)
        members = {t: v for (t, f), v in current.items() if f == point.flavor and limits.cohort_of.get(t, t) == cohort[0]}
        held = sum(members.values())
        if cohort not in cohort_worst or held > cohort_worst[cohort][0]:
            cohort_worst[cohort] = (held, point, ", ".join(f"{t} {v:g}" for t, v in sorted(members.items())))
    units, examples = 0, []
    for (tenant, flavor), (gpus, point) in sorted(worst.items()):
        limit = limits.tenants.get((tenant, flavor))
        if limit is not None and gpus > limit + 1e-9:
            units += round((gpus - limit) * UNITS_PER_GPU)
            examples.append(f"{tenant}: reserved {gpus:g} {flavor}, limit {limit:g} (event {point.position}, "
                            f"job {point.job_id})")
    for (cohort, flavor), (gpus, point, held_by) in sorted(cohort_worst.items()):
        limit = limits.cohorts.get((cohort, flavor))
        if limit is not None and gpus > limit + 1e-9:
            units += round((gpus - limit) * UNITS_PER_GPU)
            examples.append(f"cohort {cohort}: reserved {gpus:g} {flavor}, total {limit:g} (event {point.position}, "
                            f"job {point.job_id}; {held_by})")
    return units, examples


def quota_held_at_end(usage: list[tuple[str, str, int]], limits: QuotaLimits) -> tuple[int, list[str]]:
    """Units still reserved once every job ended (``usage``: tenant, flavor, units reserved, from the quota
    service's own table): a release that never happened holds quota, and so GPUs, for good."""
    left = [(t, f, u) for t, f, u in usage if u > 0 and t in limits.cohort_of]
    return (round(sum(u for _, _, u in left) * UNITS_PER_GPU / SERVICE_UNITS_PER_GPU),
            [f"{t}: {u / SERVICE_UNITS_PER_GPU:g} {f} still reserved at the end" for t, f, u in sorted(left)])


def stale_reports(runs: list[Run], facts: dict[str, JobFact]) -> list[str]:
    """Jobs whose recorded end is not what their last run did."""
    by_key: dict[tuple[str, int | None, str], list[Run]] = defaultdict(list)
    for run in runs:
        by_key[(run.job_id, run.attempt, run.node)].append(run)
    found = []
    for fact in sorted(facts.values(), key=lambda f: f.job_id):
        if fact.end_exit_code is None or fact.status not in ("Succeeded", "Failed") or fact.end_exit_code in SIGNALLED:
            continue  # an end by a signal (the system's doing) names no exit its run chose
        for node in fact.end_nodes:
            last = by_key.get((fact.job_id, fact.attempts, node), [])
            if not any(r.exit_code == fact.end_exit_code for r in last):
                did = ", ".join(f"pid {r.pid} {'exit ' + str(r.exit_code) if r.exit_code is not None else 'killed'}"
                                for r in last) or "no run"
                found.append(f"{fact.job_id}: ended {fact.status} with {fact.end_exit_code} on {node} (attempt "
                             f"{fact.attempts}), but that run: {did}")
    return found


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))  # nearest rank
    return round(ordered[rank - 1], 3)


def check(*, seed: int, acknowledged: list[str], facts: dict[str, JobFact], runs: list[Run],
          quota: list[QuotaPoint], limits: QuotaLimits, unpublished: int, faults: list[str],
          recoveries: list[float], unexpected_failures: list[str] = (),
          usage_at_end: list[tuple[str, str, int]] = ()) -> Report:
    lost, stuck = lost_and_stuck(acknowledged, facts)
    doubles = double_runs(runs, facts)
    over_s, over_examples = double_allocated_seconds(runs)
    overshoot, quota_examples = quota_overshoot(quota, limits)
    held_at_end, held_examples = quota_held_at_end(list(usage_at_end), limits)
    stale = stale_reports(runs, facts)
    by_kind: dict[str, int] = defaultdict(int)
    for kind in faults:
        by_kind[kind] += 1
    examples = {name: items[:10] for name, items in (("lost", lost), ("stuck", stuck), ("double_runs", doubles),
                                                      ("double_allocated", over_examples), ("quota", quota_examples),
                                                      ("quota_held_at_end", held_examples),
                                                      ("stale", stale),
                                                      ("unexpected_failures", list(unexpected_failures))) if items}
    return Report(jobs=len(acknowledged), faults=len(faults), faults_by_kind=dict(sorted(by_kind.items())),
                  lost_jobs=len(lost), double_runs=len(doubles), double_allocated_gpu_seconds=over_s,
                  quota_overshoot_units=overshoot, stale_reports_applied=len(stale), stuck_jobs=len(stuck),
                  recovery_p50_s=percentile(recoveries, 0.5), recovery_p99_s=percentile(recoveries, 0.99), seed=seed,
                  unpublished_outbox_rows=unpublished, unexpected_failures=len(unexpected_failures),
                  quota_held_at_end_units=held_at_end,
                  examples=examples)


def table(report: Report, recoveries: list, goal_s: float, exercised: dict[str, int]) -> str:
    rows = [("jobs", report.jobs), ("faults", report.faults),
            ("faults by kind", ", ".join(f"{k} {v}" for k, v in report.faults_by_kind.items())),
            ("lost jobs", report.lost_jobs), ("double runs", report.double_runs),
            ("double-allocated GPU-seconds", report.double_allocated_gpu_seconds),
            ("quota overshoot (units)", report.quota_overshoot_units),
            ("quota held at the end (units)", report.quota_held_at_end_units),
            ("stale reports applied", report.stale_reports_applied), ("stuck jobs", report.stuck_jobs),
            ("unpublished outbox rows", report.unpublished_outbox_rows),
            ("unexpected failures", report.unexpected_failures),
            ("recovery p50 / p99 (s)", f"{report.recovery_p50_s} / {report.recovery_p99_s} (goal <= {goal_s:g})"),
            ("seed", report.seed)]
    rows += [("exercised", ", ".join(f"{k} {v}" for k, v in exercised.items()))] if exercised else []
    width = max(len(r[0]) for r in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    skipped = [r for r in recoveries if r.done.startswith("skipped")]
    lines += [f"skipped: {r.kind} ({r.done[len('skipped: '):]})" for r in skipped]
    for name, items in report.examples.items():
        lines.append(f"{name}:")
        lines += [f"  {item}" for item in items]
    return "\n".join(lines)
