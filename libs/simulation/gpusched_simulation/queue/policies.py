"""Queueing policies compared by ``gpusched simulate-queue``; every one runs under the same quota core
(nominal quota + borrowing limits, tenants under nominal first), so quota is never exceeded.

- ``fifo``: submission order. No preemption.
- ``sjf``: oracle shortest job first (knows every duration). No preemption.
- ``tiresias``: 2-queue least-attained-service (Tiresias' discretised 2D-LAS): a job that has used
  ``las_threshold_gpu_s`` GPU-seconds drops to the second queue and may be preempted (checkpoint and
  resume) by a first-queue job; FIFO within a queue.
- ``drf``: dominant share of entitlement (current reservations only), reclaim of borrowed quota for
  tenants under their nominal quota.
- ``fairshare`` (default): time-decayed DRF across tenants inside 2-queue LAS, with reclaim: new and
  short work first, tenants that used less than their entitlement recently first within a queue,
  borrowed capacity given back to owners. A job of a whole node or more preempts (LAS) only its own
  tenant's runs or those of tenants above its fair share (``preempt.las_victims``). Needs no job
  durations: it uses attained GPU-seconds, GPUs requested and tenants' decayed usage. Tenants are
  ranked by their deficit against a fair entitlement (``gpusched_core.quota.fairness``), and a waiting
  job of a tenant within its entitlement preempts runs (older than ``fair_quantum_s``) of tenants whose
  share is over its tenant's by more than ``fair_preemption_margin`` (``preempt.fair_victims``); and
  while such a job waits for room, no other tenant backfills past the share at which it could be
  preempted for it (``fair_backfill``, ``backfill``).

Every preemption, whatever the policy, is made for one job that it lets start at once (``engine``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpusched_core.quota import FairShareOrder, FifoOrder, JobOrder, PendingJob
from gpusched_core.quota.fairness import DEFAULT_FAIR_PREEMPTION_MARGIN as DEFAULT_FAIR_PREEMPTION_MARGIN
from gpusched_core.quota.ordering import SortKey

DEFAULT_POLICY = "fairshare"
DEFAULT_HALF_LIFE_S = 6 * 3600.0
DEFAULT_LAS_THRESHOLD_GPU_S = 3600.0
DEFAULT_FAIR_QUANTUM_S = 600.0


@dataclass(frozen=True)
class SjfOrder:
    """Oracle: priority class, then the job's true duration, then submission time and job id."""

    durations: Mapping[str, float]
    name: str = "sjf"

    def tenant_key(self, job: PendingJob, priority: int) -> SortKey:
        return (-priority, self.durations[job.job_id], job.submitted_at_s, job.job_id)

    def merged_key(self, tenant_key: SortKey, share: float) -> SortKey:
        return tenant_key


@dataclass(frozen=True)
class Policy:
    name: str
    order: str  # fifo | sjf | fairshare
    half_life_s: float  # 0: shares from current reservations only
    las: bool
    reclaim: bool
    fair_gang_preemption: bool = False  # whole-node jobs preempt by fair share, not attained service
    fair_preemption_margin: float | None = None  # preempt tenants this far over the preemptor's share
    fair_quantum_s: float = DEFAULT_FAIR_QUANTUM_S  # a run is not preempted by fair share before this
    fair_backfill: bool = False  # a job blocked by the nodes holds back the tenants it could preempt

    def job_order(self, durations: Mapping[str, float]) -> JobOrder:
        if self.order == "sjf":
            return SjfOrder(durations)
        return FairShareOrder() if self.order == "fairshare" else FifoOrder()


def make_policies(half_life_s: float = DEFAULT_HALF_LIFE_S, fair_margin: float | None = DEFAULT_FAIR_PREEMPTION_MARGIN,
                  fair_quantum_s: float = DEFAULT_FAIR_QUANTUM_S) -> dict[str, Policy]:
    return {
        "fifo": Policy("fifo", "fifo", 0.0, las=False, reclaim=False),
        "sjf": Policy("sjf", "sjf", 0.0, las=False, reclaim=False),
        "tiresias": Policy("tiresias", "fifo", 0.0, las=True, reclaim=False),
        "drf": Policy("drf", "fairshare", 0.0, las=False, reclaim=True),
        "fairshare": Policy("fairshare", "fairshare", half_life_s, las=True, reclaim=True, fair_gang_preemption=True,
                            fair_preemption_margin=fair_margin, fair_quantum_s=fair_quantum_s,
                            fair_backfill=True),
    }


POLICY_NAMES = tuple(make_policies())
