"""Builders for metrics-core scenarios: `cluster().nodes("H100-80GB", 2, gpus=8).allocated("n-h100-1", 0, "j1")`."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from gpusched_core.metrics.views import ClusterSnapshot, GpuSlot, BacklogJob, TenantQuota

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class ClusterBuilder:
    def __init__(self) -> None:
        self._gpus: list[GpuSlot] = []
        self._pending: list[BacklogJob] = []
        self._quotas: list[TenantQuota] = []
        self._tenants: dict[str, str] = {}

    def nodes(self, model: str, count: int, gpus: int = 8, pool: str = "default", prefix: str | None = None):
        prefix = prefix or f"n-{model.split('-')[0].lower()}"
        start = len({g.node_id for g in self._gpus if g.node_id.startswith(prefix)})
        for n in range(start + 1, start + count + 1):
            self._gpus += [GpuSlot(f"{prefix}-{n}", i, model, pool) for i in range(gpus)]
        return self

    def allocated(self, node_id: str, index: int, job_id: str, tenant: str = "t1", since: float = 0.0):
        self._gpus = [replace(g, job_id=job_id, allocated_at=at(since)) if (g.node_id, g.index) == (node_id, index)
                      else g for g in self._gpus]
        self._tenants[job_id] = tenant
        return self

    def fill(self, node_id: str, job_prefix: str = "busy"):
        for g in [g for g in self._gpus if g.node_id == node_id]:
            self.allocated(node_id, g.index, f"{job_prefix}-{node_id}-{g.index}")
        return self

    def unhealthy(self, node_id: str, index: int):
        self._gpus = [replace(g, healthy=False) if (g.node_id, g.index) == (node_id, index) else g for g in self._gpus]
        return self

    def pending(self, job_id: str, gpus: int, model: str | None, tenant: str = "t1", reserved: bool = True):
        self._pending.append(BacklogJob(tenant, gpus, model, reserved))  # ``job_id`` names the line only
        return self

    def quota(self, tenant: str, cap: int, reserved: int):
        self._quotas.append(TenantQuota(tenant, cap, reserved))
        return self

    def build(self) -> ClusterSnapshot:
        return ClusterSnapshot(tuple(self._gpus), tuple(self._pending), tuple(self._quotas), dict(self._tenants))


def cluster() -> ClusterBuilder:
    return ClusterBuilder()
