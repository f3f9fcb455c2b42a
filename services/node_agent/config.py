"""One node agent's configuration, from the process settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpusched_core.agent.retention import DEFAULT_LOG_RETENTION_S

from services.node_agent.faults import Fault, parse_faults
from services.node_agent.health import HealthPolicy, parse_xids
from services.node_agent.inventory import parse_labels
from services.node_agent.settings import AgentSettings


@dataclass(frozen=True)
class AgentConfig:
    node_id: str
    heartbeat_interval_s: float = 10.0
    telemetry_interval_s: float = 5.0
    health_interval_s: float = 2.0
    lease_ttl_s: float = 30.0
    fence_grace_s: float = 10.0
    gpu_fault_policy: str = "stop"
    health_policy: HealthPolicy = HealthPolicy()
    labels: dict[str, str] = field(default_factory=dict)
    mps_pipe_dir: Path | None = None
    faults: tuple[Fault, ...] = ()
    log_url: str | None = None  # the process's log server, advertised at registration
    log_retention_s: float = DEFAULT_LOG_RETENTION_S  # an ended job's output is deleted this long after its last write

    @classmethod
    def from_settings(cls, settings: AgentSettings, node_id: str) -> AgentConfig:
        return cls(node_id=node_id, heartbeat_interval_s=settings.heartbeat_interval_s,
                   telemetry_interval_s=settings.telemetry_interval_s, health_interval_s=settings.health_interval_s,
                   lease_ttl_s=settings.lease_ttl_s, fence_grace_s=settings.fence_grace_s,
                   gpu_fault_policy=settings.gpu_fault_policy,
                   health_policy=HealthPolicy(ignored_xids=parse_xids(settings.health_ignored_xids)),
                   labels=parse_labels(settings.node_labels), mps_pipe_dir=settings.mps_pipe_dir,
                   faults=parse_faults(settings.simulated_faults), log_retention_s=settings.agent_log_retention_s)
