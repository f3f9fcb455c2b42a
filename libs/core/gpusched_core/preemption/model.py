"""Value types of victim selection: what the caller builds (inputs) and what it acts on (the plan).

Times are plain seconds on one clock chosen by the caller (epoch seconds live, virtual seconds in the
simulator); the core never reads a clock. Everything is frozen: a plan can be logged and replayed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, TypeAlias

from gpusched_core.placement import Decision, GangRequest, PodRequest

Outcome: TypeAlias = Literal["fits", "await", "preempt", "none"]
CrossTenant: TypeAlias = Literal["any", "borrowing-only"]


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job that holds resources in the snapshot.

    ``allocation_ids``: the snapshot allocations the job holds (one per pod; a gang lists every member,
    or its one id when it was placed with ``place_gang``). Preempting the job releases all of them, so a
    gang is always preempted whole. ``units``: what the quota ledger charges it (any one unit, used for
    reclaim and fair-share limits). ``preempting``: already asked to stop (its grace period runs); its
    resources count as freed and it is never chosen again. ``flavor``: the quota flavor (GPU model) it
    is charged to, and ``preempted_for``: the job it is stopping for, both used by reclaim
    (``reclaim.plan_reclaim``) and optional elsewhere.
    """

    job_id: str
    tenant: str
    priority: int
    started_at_s: float
    allocation_ids: tuple[str, ...]
    priority_class: str = ""
    units: int = 0
    last_checkpoint_at_s: float | None = None
    preempting: bool = False
    flavor: str | None = None
    preempted_for: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocation_ids", tuple(self.allocation_ids))
        if not self.allocation_ids:
            raise ValueError(f"running job {self.job_id} holds no allocation")


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The pending job that cannot be placed: its placement request and who it is."""

    job_id: str
    tenant: str
    priority: int
    request: PodRequest | GangRequest
    units: int = 0


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's nominal quota and current usage, in the ledger's units (borrowing: used > nominal)."""

    nominal_units: int
    used_units: int

    @property
    def borrowed_units(self) -> int:
        return max(0, self.used_units - self.nominal_units)


# --- triggers --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PriorityTrigger:
    """A higher-priority job cannot be placed: victims are jobs of strictly lower priority."""

    kind: Literal["priority"] = "priority"


@dataclass(frozen=True, slots=True)
class ReclaimRequest:
    """A tenant under its nominal quota is blocked by capacity that others borrowed.

    ``borrowers``: (tenant, units borrowed above nominal), as the quota core's ``ReclaimRequest`` lists
    them. Victims come only from these tenants, and a tenant loses jobs only while it still borrows.
    ``flavor``: the GPU model whose borrowed capacity is returned (for the victims' reasons).
    """

    tenant: str
    borrowers: tuple[tuple[str, int], ...]
    units: int = 0
    flavor: str = ""
    kind: Literal["reclaim"] = "reclaim"


@dataclass(frozen=True, slots=True)
class FairShareTrigger:
    """Fair-share preemption (off unless ``SelectionConfig.fair_share_enabled``).

    ``usage_units`` and ``weights`` per tenant. A tenant ``t`` may lose jobs only while its share
    ``usage/weight`` after the preemption stays at or above the preemptor's tenant share once the
    preemptor runs, so the preemption can never be reversed by the victim's tenant.
    """

    usage_units: Mapping[str, int]
    weights: Mapping[str, float]
    kind: Literal["fair-share"] = "fair-share"

    def __post_init__(self) -> None:
        object.__setattr__(self, "usage_units", MappingProxyType(dict(self.usage_units)))
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))


Trigger: TypeAlias = PriorityTrigger | ReclaimRequest | FairShareTrigger


@dataclass(frozen=True, slots=True)
class SelectionConfig:
    """Validated settings of the preemption core.

    ``min_runtime_s``: per priority class, how long a run is protected after it (re)started
    (``default_min_runtime_s`` for other classes). ``cross_tenant``: whether a priority preemption may
    take another tenant's job always (``any``) or only while that tenant borrows (``borrowing-only``).
    ``reclaim_lower_priority_only``: reclaim takes only jobs of lower priority than the preemptor.
    The search caps bound the exact per-node search; past them it falls back to greedy-then-prune,
    which is still minimal (no victim can be spared) and says so in the reasons.
    """

    min_runtime_s: Mapping[str, float] = field(default_factory=dict)
    default_min_runtime_s: float = 0.0
    cross_tenant: CrossTenant = "borrowing-only"
    reclaim_lower_priority_only: bool = False
    fair_share_enabled: bool = False
    victim_order: str = "default"
    max_combinations_per_node: int = 20_000
    max_fit_checks_per_node: int = 400

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_runtime_s", MappingProxyType(dict(self.min_runtime_s)))
        if self.cross_tenant not in ("any", "borrowing-only"):
            raise ValueError(f"cross_tenant must be 'any' or 'borrowing-only', got {self.cross_tenant!r}")
        if self.max_combinations_per_node < 1 or self.max_fit_checks_per_node < 1:
            raise ValueError("search caps must be >= 1")

    def protection_s(self, priority_class: str) -> float:
        return float(self.min_runtime_s.get(priority_class, self.default_min_runtime_s))


# --- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Victim:
    """A job to preempt, with what it loses and the reason it is told."""

    job_id: str
    tenant: str
    priority: int
    allocation_ids: tuple[str, ...]
    gpu_milli: int
    lost_work_s: float
    reason: str

    @property
    def lost_gpu_s(self) -> float:
        return self.lost_work_s * self.gpu_milli / 1000.0


@dataclass(frozen=True, slots=True)
class PreemptionPlan:
    """What to do for one preemptor.

    - ``fits``: it can be placed now; ``placement`` says where (no preemption).
    - ``await``: it fits once jobs already being preempted (``awaiting``) stop; no new victims.
    - ``preempt``: preempt ``victims``; ``placement`` is the slot to reserve for the preemptor.
    - ``none``: no allowed set of victims lets it run; nothing is preempted; ``reasons`` say why.

    ``exact``: the victim count is the proven minimum (False when a search cap was reached: the set
    is then minimal, no victim can be spared, but a smaller one may exist on some node).
    """

    preemptor_id: str
    trigger: str
    outcome: Outcome
    victims: tuple[Victim, ...] = ()
    awaiting: tuple[str, ...] = ()
    awaiting_allocation_ids: tuple[str, ...] = ()
    placement: Decision | None = None
    reasons: tuple[str, ...] = ()
    exact: bool = True

    @property
    def victim_ids(self) -> tuple[str, ...]:
        return tuple(victim.job_id for victim in self.victims)
