"""Scale decisions for an autoscaler."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from gpusched_common.events.base import Payload


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
