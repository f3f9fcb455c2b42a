"""Cluster views from inventory, allocations, the queue and NVML telemetry (pure).

`plan_views(snapshot, activity, now, thresholds)` answers: how many GPUs exist, are allocated and are
actually used, per cluster, node pool and GPU model; which allocations sit idle (naming their jobs);
the queue backlog per model; per-tenant usage against quota; and fragmentation. Time comes in as `now`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

BUSY_THRESHOLD_PCT = 5.0
ANY_MODEL = "any"


@dataclass(frozen=True)
class GpuReading:
    """The latest NVML sample of one GPU, and when it was last seen busy (or first seen, if never)."""

    node_id: str
    index: int
    utilization_pct: float
    sampled_at: datetime
    memory_used_mib: int = 0
    last_busy_at: datetime | None = None
    healthy: bool = True


@dataclass(frozen=True)
class GpuSlot:
    """One GPU of the inventory and the job (if any) it is allocated to."""

    node_id: str
    index: int
    model: str
    pool: str = "default"
    healthy: bool = True
    job_id: str | None = None
    allocated_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class BacklogJob:
    """A job waiting (for quota or for GPUs), by what the backlog the scaler and the views count is made of:
    jobs alike are one object, repeated (``ClusterSnapshot.pending`` holds a reference per waiting job)."""

    tenant: str
    gpus: int
    gpu_model: str | None
    quota_reserved: bool = True  # False: still waiting for quota (more nodes would not help it)


@dataclass(frozen=True)
class TenantQuota:
    """A tenant's nominal quota and the quota its jobs hold, in GPUs over every flavor (shares and MIG
    slices make fractions)."""

    tenant: str
    cap_gpus: float
    reserved_gpus: float


@dataclass(frozen=True)
class ClusterSnapshot:
    gpus: tuple[GpuSlot, ...] = ()
    pending: tuple[BacklogJob, ...] = ()
    quotas: tuple[TenantQuota, ...] = ()
    job_tenants: Mapping[str, str] = field(default_factory=dict)  # running job -> tenant


@dataclass(frozen=True)
class Thresholds:
    max_sample_age: timedelta = timedelta(seconds=15)
    busy_pct: float = BUSY_THRESHOLD_PCT
    idle_after: timedelta = timedelta(minutes=5)


@dataclass(frozen=True)
class GroupView:
    """GPUs of a group (the cluster, a pool or a model): inventory, allocation and real use."""

    key: str
    gpus_total: int = 0
    gpus_healthy: int = 0
    gpus_allocated: int = 0
    gpus_reporting: int = 0
    gpus_busy: int = 0
    gpus_allocated_idle: int = 0
    utilization_sum_pct: float = 0.0

    @property
    def mean_utilization(self) -> float:
        """0..1 over GPUs with a fresh sample."""
        return round(self.utilization_sum_pct / self.gpus_reporting / 100.0, 4) if self.gpus_reporting else 0.0

    @property
    def allocation_ratio(self) -> float:
        return round(self.gpus_allocated / self.gpus_total, 4) if self.gpus_total else 0.0


@dataclass(frozen=True)
class IdleAllocation:
    job_id: str
    tenant: str | None
    node_id: str
    gpu_indices: tuple[int, ...]
    idle_s: float


@dataclass(frozen=True)
class Backlog:
    model: str
    pending_jobs: int
    pending_gpus: int
    waiting_for_quota_gpus: int


@dataclass(frozen=True)
class TenantView:
    tenant: str
    allocated_gpus: int
    busy_gpus: int
    reserved_gpus: float
    cap_gpus: float | None


@dataclass(frozen=True)
class Views:
    cluster: GroupView
    pools: tuple[GroupView, ...]
    models: tuple[GroupView, ...]
    idle: tuple[IdleAllocation, ...]
    backlog: tuple[Backlog, ...]
    tenants: tuple[TenantView, ...]
    fragmentation: Mapping[str, float]  # model -> ratio of free GPUs pending requests could not use


def _fresh(reading: GpuReading | None, now: datetime, thresholds: Thresholds) -> bool:
    return reading is not None and now - reading.sampled_at <= thresholds.max_sample_age


def _group(key: str, gpus: Iterable[GpuSlot], activity: Mapping[tuple[str, int], GpuReading], now: datetime,
           thresholds: Thresholds, idle: set[tuple[str, int]]) -> GroupView:
    total = healthy = allocated = reporting = busy = allocated_idle = 0
    util = 0.0
    for gpu in gpus:
        total += 1
        healthy += gpu.healthy
        allocated += gpu.job_id is not None
        allocated_idle += (gpu.node_id, gpu.index) in idle
        reading = activity.get((gpu.node_id, gpu.index))
        if _fresh(reading, now, thresholds):
            assert reading is not None
            reporting += 1
            util += reading.utilization_pct
            busy += reading.utilization_pct > thresholds.busy_pct
    return GroupView(key, total, healthy, allocated, reporting, busy, allocated_idle, util)


def idle_allocations(gpus: Iterable[GpuSlot], activity: Mapping[tuple[str, int], GpuReading],
                     job_tenants: Mapping[str, str], now: datetime, thresholds: Thresholds) -> tuple[IdleAllocation, ...]:
    """Jobs every GPU of which has been at or below the busy threshold for longer than `idle_after`.

    Idle time counts from the later of the allocation and the GPU's last busy sample; a GPU without a
    fresh sample is not called idle (no evidence either way).
    """
    by_job: dict[str, list[tuple[GpuSlot, float]]] = {}
    for gpu in gpus:
        if gpu.job_id is None:
            continue
        reading = activity.get((gpu.node_id, gpu.index))
        if not _fresh(reading, now, thresholds) or reading is None or reading.utilization_pct > thresholds.busy_pct:
            by_job.setdefault(gpu.job_id, []).append((gpu, -1.0))
            continue
        marks = [t for t in (gpu.allocated_at, reading.last_busy_at) if t is not None]
        since = max(marks) if marks else reading.sampled_at
        by_job.setdefault(gpu.job_id, []).append((gpu, (now - since).total_seconds()))
    out = []
    limit = thresholds.idle_after.total_seconds()
    for job_id, members in by_job.items():
        idle_s = min(s for _, s in members)
        if idle_s > limit:
            node_id = members[0][0].node_id
            out.append(IdleAllocation(job_id, job_tenants.get(job_id), node_id,
                                      tuple(sorted(g.index for g, _ in members)), round(idle_s, 1)))
    return tuple(sorted(out, key=lambda a: (-a.idle_s, a.job_id)))


def backlog_by_model(pending: Iterable[BacklogJob]) -> tuple[Backlog, ...]:
    jobs: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    for job in pending:
        model = job.gpu_model or ANY_MODEL
        jobs[model] += 1
        if job.quota_reserved:
            gpus[model] += job.gpus
        else:
            waiting[model] += job.gpus
    return tuple(Backlog(m, jobs[m], gpus[m], waiting[m]) for m in sorted(jobs))


def free_gpus_by_node(gpus: Iterable[GpuSlot]) -> dict[str, dict[str, int]]:
    """model -> node -> free healthy GPUs."""
    free: dict[str, dict[str, int]] = {}
    for gpu in gpus:
        if gpu.healthy and gpu.job_id is None:
            nodes = free.setdefault(gpu.model, {})
            nodes[gpu.node_id] = nodes.get(gpu.node_id, 0) + 1
    return free


def fragmentation(gpus: Iterable[GpuSlot], pending: Iterable[BacklogJob]) -> dict[str, float]:
    """Per model: the share of free GPUs that a request drawn from the pending queue could not use.

    For each request size s (weighted by how many pending jobs ask for it), a node's free GPUs are usable
    when the node has at least s free; the rest are fragmented (the FGD measure for whole GPUs). With no
    pending request for a model, one-GPU requests are assumed, so nothing is fragmented.
    """
    gpus = tuple(gpus)
    free = {model: {} for model in sorted({g.model for g in gpus})} | free_gpus_by_node(gpus)
    sizes: dict[str, Counter[int]] = {}
    for job in pending:
        for model in ([job.gpu_model] if job.gpu_model else list(free)):
            sizes.setdefault(model, Counter())[job.gpus] += 1
    out = {}
    for model, nodes in sorted(free.items()):
        total_free = sum(nodes.values())
        dist = sizes.get(model) or Counter({1: 1})
        weight = sum(dist.values())
        fragmented = sum(count / weight * sum(f for f in nodes.values() if f < size) for size, count in dist.items())
        out[model] = round(fragmented / total_free, 4) if total_free else 0.0
    return out


def tenant_views(snapshot: ClusterSnapshot, activity: Mapping[tuple[str, int], GpuReading], now: datetime,
                 thresholds: Thresholds) -> tuple[TenantView, ...]:
    allocated: Counter[str] = Counter()
    busy: Counter[str] = Counter()
    for gpu in snapshot.gpus:
        tenant = snapshot.job_tenants.get(gpu.job_id or "")
        if tenant is None:
            continue
        allocated[tenant] += 1
        reading = activity.get((gpu.node_id, gpu.index))
        if _fresh(reading, now, thresholds) and reading is not None and reading.utilization_pct > thresholds.busy_pct:
            busy[tenant] += 1
    quotas = {q.tenant: q for q in snapshot.quotas}
    tenants = sorted(set(allocated) | set(quotas))
    return tuple(TenantView(t, allocated[t], busy[t], quotas[t].reserved_gpus if t in quotas else 0,
                            quotas[t].cap_gpus if t in quotas else None) for t in tenants)


def plan_views(snapshot: ClusterSnapshot, activity: Mapping[tuple[str, int], GpuReading], now: datetime,
               thresholds: Thresholds = Thresholds()) -> Views:
    idle = idle_allocations(snapshot.gpus, activity, snapshot.job_tenants, now, thresholds)
    idle_gpus = {(a.node_id, i) for a in idle for i in a.gpu_indices}
    pools = sorted({g.pool for g in snapshot.gpus})
    models = sorted({g.model for g in snapshot.gpus})
    return Views(
        cluster=_group("cluster", snapshot.gpus, activity, now, thresholds, idle_gpus),
        pools=tuple(_group(p, (g for g in snapshot.gpus if g.pool == p), activity, now, thresholds, idle_gpus)
                    for p in pools),
        models=tuple(_group(m, (g for g in snapshot.gpus if g.model == m), activity, now, thresholds, idle_gpus)
                     for m in models),
        idle=idle,
        backlog=backlog_by_model(snapshot.pending),
        tenants=tenant_views(snapshot, activity, now, thresholds),
        fragmentation=fragmentation(snapshot.gpus, [p for p in snapshot.pending if p.quota_reserved]),
    )
