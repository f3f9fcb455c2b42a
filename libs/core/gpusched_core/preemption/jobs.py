"""Pure translations between the job and quota contracts and the selection core: a job's placement
request and quota charge, a reclaim request's ask, and the ``PreemptJob`` commands that stop a victim."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from gpusched_core import lifecycle
from gpusched_common import events as ev
from gpusched_common.resources import canonical_model

from gpusched_core import placement as engine
from gpusched_core.placement.cycle import pending_from_spec, request_for
from gpusched_core import preemption as sel
from gpusched_core.quota.units import UNITS_PER_GPU, GpuAsk, gpus_to_units, units_for


def request_of(job_id: str, spec: ev.JobSpec, model: str | None = None) -> engine.PodRequest | engine.GangRequest:
    """The placement request of the job's shape (whole GPUs, gang, share or MIG slice), as placement
    builds it, limited to ``model`` when given, else to the model the spec names (any when none)."""
    wanted = model or spec.gpu_model
    return request_for(replace(pending_from_spec(job_id, spec), gpu_model=canonical_model(wanted) or wanted
                               if wanted else None))


def quota_units_of(spec: ev.JobSpec, flavor: str) -> int:
    """What quota charges the job on ``flavor`` (7000 units per GPU; default MIG slices per GPU)."""
    ask = GpuAsk(gpus=spec.whole_gpus, share_milli=spec.gpu_share.milli if spec.gpu_share else 0,
                 mig_profile=spec.mig_profile)
    return units_for(ask, flavor, {})


def reclaim_ask(request: ev.ReclaimRequested) -> sel.ReclaimAsk:
    """The selection core's view of a quota reclaim request (GPUs converted to quota units)."""
    borrowers = tuple((b.tenant, gpus_to_units(b.borrowed_gpus)) for b in request.borrowers)
    return sel.ReclaimAsk(request.tenant, request.flavor, gpus_to_units(request.gpus), borrowers,
                          request.requested_at.timestamp())


def member_nodes(state: lifecycle.JobState) -> tuple[str, ...]:
    """Every node the job's run occupies: each member of a gang, else its one node."""
    if state.node_ids:
        return tuple(dict.fromkeys(state.node_ids))
    return (state.node_id,) if state.node_id is not None else ()


def preempt_commands(state: lifecycle.JobState, grace_s: float, deadline_at: datetime,
                     reason: str) -> tuple[ev.PreemptJob, ...]:
    """One ``PreemptJob`` per node of the victim's run, so that every member of a gang stops."""
    return tuple(ev.PreemptJob(job_id=state.job_id, node_id=node, grace_s=grace_s, deadline_at=deadline_at,
                               reason=reason, attempt=state.runs or None) for node in member_nodes(state))


def quota_charge(tenant: str, held_gpus: int, models: tuple[str, ...], *, reserved_tenant: str | None = None,
                 reserved_flavor: str | None = None, reserved_units: int | None = None) -> tuple[str, str | None, int]:
    """What quota charges a running job, as (tenant, flavor, units): its reservation when it has one; else
    its own tenant, whole GPUs held, on the one model it holds (None: several or none)."""
    flavor = reserved_flavor or (models[0] if len(models) == 1 else None)
    return reserved_tenant or tenant, flavor, reserved_units or held_gpus * UNITS_PER_GPU
