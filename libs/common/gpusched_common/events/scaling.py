"""Scale decisions for an autoscaler, and quota's reclaim requests to the preemption service."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from gpusched_common.events.base import Frozen, Payload


class ScaleOutRequested(Payload):
    """The metrics service asks an autoscaler for `nodes` more nodes of `gpu_model`, with its evidence."""

    TYPE: ClassVar[str] = "ScaleOutRequested"
    gpu_model: str
    nodes: int
    reason: str
    pending_gpus: int
    unplaceable_gpus: int
    free_gpus: int
    gpus_per_node: int
    in_flight_nodes: int
    pressure_since: datetime
    decided_at: datetime
    pool: str | None = None


class ScaleInRequested(Payload):
    """The metrics service asks an autoscaler to remove `node_id`, empty since `empty_since`."""

    TYPE: ClassVar[str] = "ScaleInRequested"
    node_id: str
    gpu_model: str
    reason: str
    empty_since: datetime
    idle_s: float
    nodes_of_model: int
    pending_gpus: int
    decided_at: datetime
    pool: str | None = None


class ReclaimBorrower(Frozen):
    tenant: str
    borrowed_gpus: float  # held above its nominal quota of the flavor


class ReclaimRequested(Payload):
    """Quota asks preemption to free ``gpus`` of ``flavor`` that ``borrowers`` hold above their nominal
    quota, so that ``tenant`` (under its nominal quota) can run ``for_jobs``. Victims come only from the
    borrowers, and only while they still borrow; a request that would free nothing usable is declined."""

    TYPE: ClassVar[str] = "ReclaimRequested"
    tenant: str
    cohort: str
    flavor: str
    gpus: float
    for_jobs: list[str]
    borrowers: list[ReclaimBorrower] = Field(default_factory=list)
    reason: str
    requested_at: datetime
