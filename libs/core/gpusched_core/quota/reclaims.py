"""Which of a cycle's reclaim requests to send to the preemption service, and what they say (pure).

A cycle plans a ``ReclaimRequest`` whenever a tenant under its nominal quota waits while others borrow
its share, and cycles run on every batch of job events: sending each plan would flood the preemption
service. A request is sent when its (tenant, flavor) was never asked for, when it names a waiting job the
last request did not (new work is owed its share too), or when the last request is older than the
cooldown and the tenant still waits (the first one may have freed too little, or been declined).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gpusched_common import events as ev

from gpusched_core.quota import ReclaimRequest, Tenancy, format_gpus, units_to_gpus


@dataclass(frozen=True)
class SentReclaim:
    """The last reclaim sent for a (tenant, flavor)."""

    for_jobs: frozenset[str]
    requested_at_s: float


def select_reclaims(requests: tuple[ReclaimRequest, ...], sent: Mapping[tuple[str, str], SentReclaim],
                    now_s: float, cooldown_s: float) -> tuple[ReclaimRequest, ...]:
    """The requests to send now, in the plan's order (see the module docstring)."""
    out = []
    for request in requests:
        last = sent.get((request.tenant, request.flavor))
        if (last is None or not set(request.for_jobs) <= last.for_jobs
                or now_s - last.requested_at_s >= cooldown_s):
            out.append(request)
    return tuple(out)


def reclaim_reason(request: ReclaimRequest, tenancy: Tenancy, used_units: int) -> str:
    """``tenant team-a holds 2 of its nominal 8 A100-80GB while team-b borrows 6: reclaim 4 for 2 waiting
    job(s)``."""
    nominal = tenancy.nominal_units(request.tenant, request.flavor) if request.tenant in tenancy.tenants else 0
    borrowers = ", ".join(f"{name} borrows {format_gpus(units)}" for name, units in request.borrowers)
    jobs = len(request.for_jobs)
    return (f"tenant {request.tenant} holds {format_gpus(used_units)} of its nominal {format_gpus(nominal)} "
            f"{request.flavor} while {borrowers}: reclaim {format_gpus(request.units)} for {jobs} waiting "
            f"job{'s' if jobs != 1 else ''}")


def reclaim_event(request: ReclaimRequest, tenancy: Tenancy, cohort: str, used_units: int,
                  now: datetime) -> ev.ReclaimRequested:
    return ev.ReclaimRequested(
        tenant=request.tenant, cohort=cohort, flavor=request.flavor, gpus=units_to_gpus(request.units),
        for_jobs=list(request.for_jobs),
        borrowers=[ev.ReclaimBorrower(tenant=name, borrowed_gpus=units_to_gpus(units))
                   for name, units in request.borrowers],
        reason=reclaim_reason(request, tenancy, used_units), requested_at=now)
