"""Many simulated node agents in one process (hundreds of nodes on one machine).

One consumer reads the command topic's partitions the fleet's nodes hash to (`app.agent_setup`) and hands
each command to the agent its key names, so a fleet of N nodes costs one consumer and one group, not N;
every agent keeps its own work directory, lease, health and loops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from gpusched_common.messaging import Incoming
from gpusched_common.tasks import cancel_and_wait

from services.node_agent.agent import Agent


def fleet_node_ids(prefix: str, count: int) -> list[str]:
    width = max(3, len(str(count)))
    return [f"{prefix}-{i:0{width}d}" for i in range(1, count + 1)]


class Fleet:
    def __init__(self, agents: Iterable[Agent]) -> None:
        self.agents = {agent.node_id: agent for agent in agents}

    async def on_command(self, message: Incoming) -> None:
        agent = self.agents.get(message.key or "")
        if agent is not None:
            await agent.on_command(message)

    async def run(self, stagger_s: float = 0.01) -> None:
        """Start every agent (staggered, so registrations and ticks do not all land at once) and run them."""
        tasks = []
        for agent in self.agents.values():
            tasks.append(asyncio.create_task(agent.run(), name=f"agent:{agent.node_id}"))
            await asyncio.sleep(stagger_s)
        try:
            await asyncio.gather(*tasks)
        finally:
            await cancel_and_wait(tasks, what="the fleet's agents")
            await asyncio.gather(*(agent.close() for agent in self.agents.values()), return_exceptions=True)
