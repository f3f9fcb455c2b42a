"""What the parts of one node's agent share: its configuration, devices, job runner and reporter, the
lease and GPU health they all read (replaced whole by the part that owns each: the heartbeat the lease,
the health monitor the health), and the background tasks they start."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpusched_common.tasks import cancel_and_wait
from gpusched_core.agent.lease import Lease

from services.node_agent.config import AgentConfig
from services.node_agent.health import GpuHealth
from services.node_agent.nvml import NvmlBackend
from services.node_agent.reporter import Reporter
from services.node_agent.runner import JobRunner


@dataclass
class AgentContext:
    config: AgentConfig
    backend: NvmlBackend
    runner: JobRunner
    reporter: Reporter
    monotonic: Callable[[], float]
    started_at: float  # monotonic
    lease: Lease
    health: dict[int, GpuHealth] = field(default_factory=dict)
    tasks: set[asyncio.Task] = field(default_factory=set)

    @property
    def node_id(self) -> str:
        return self.config.node_id

    def elapsed_s(self) -> float:
        """Seconds since the agent was built (what fault schedules count from)."""
        return self.monotonic() - self.started_at

    def unhealthy_gpus(self) -> list[int]:
        """The node's cordoned GPUs, in index order."""
        return sorted(i for i, h in self.health.items() if not h.healthy)

    def spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.node_id}:{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel_tasks(self) -> None:
        await cancel_and_wait(list(self.tasks), what=f"{self.node_id}'s tasks")
