"""Admission against the tenancy in force: a job its tenant may never run is rejected at once, with every
reason, instead of waiting in quota forever. Quota remains the enforcer; this is the early answer.

``check_against_tenancy`` is pure. ``TenancyReader`` is the shell: it reads the newest revision quota
installed (quota's ``TenancyStore.read``, which parses each revision once), and looks again at most every
``refresh_s`` seconds, so a new revision reaches admission within that time.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_common import events as ev

from gpusched_core.quota import Tenancy
from gpusched_core.quota.reasons import not_allowed, unknown_tenant
from services.quota.revisions import TenancyStore
from services.quota.tenancy import priority_class_for, queued_job, to_pending


def check_against_tenancy(job_id: str, spec: ev.JobSpec, tenancy: Tenancy) -> tuple[str, ...]:
    """Every reason the tenancy refuses the job: unknown tenant, a priority class the tenant may not use,
    a GPU model with no quota anywhere, a request that cannot be charged (e.g. an unknown MIG shape)."""
    charged = tenancy.charged_tenant(spec.tenant)
    tenant = tenancy.tenants.get(charged)
    if tenant is None or not tenant.is_leaf:
        return (unknown_tenant(spec.tenant),)
    reasons = []
    priority_class = priority_class_for(tenancy, spec.priority)
    if priority_class not in tenant.priority_classes:
        reasons.append(not_allowed(spec.tenant, priority_class, tenant.priority_classes))
    if spec.gpu_model is not None and spec.gpu_model not in tenancy.flavors:
        reasons.append(f"GPU model {spec.gpu_model} has no quota in the tenancy (flavors: {', '.join(tenancy.flavors)})")
    else:
        pending = to_pending(tenancy, queued_job(job_id, spec, 0.0))
        if isinstance(pending, str):
            reasons.append(pending)
    return tuple(reasons)


class TenancyReader:
    def __init__(self, refresh_s: float = 1.0) -> None:
        self.refresh_s = refresh_s
        self._store = TenancyStore()
        self._tenancy: Tenancy | None = None
        self._checked_at: datetime | None = None

    async def current(self, conn: asyncpg.Connection, now: datetime) -> Tenancy | None:
        """The tenancy in force (None before quota installed one: then quota alone decides)."""
        if self._checked_at is None or (now - self._checked_at).total_seconds() >= self.refresh_s:
            self._checked_at = now
            self._tenancy = await self._store.read(conn)
        return self._tenancy
