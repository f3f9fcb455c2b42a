"""NVML telemetry: each GPU's sample, its processes mapped to the node's jobs, sent to the telemetry
topic; lossy by design (a sample that does not get through is superseded by the next)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from gpusched_common import events as ev
from gpusched_common.runtime import utcnow
from gpusched_common.topics import NODES_TELEMETRY

from services.node_agent.context import AgentContext
from services.node_agent.inventory import attribute_processes
from services.node_agent.runner import JobRecord

log = logging.getLogger(__name__)


class Telemetry:
    def __init__(self, ctx: AgentContext, running: Mapping[str, JobRecord]) -> None:
        self._ctx = ctx
        self._running = running  # the watched jobs (JobExits.running), read at each sample

    async def sample_once(self) -> None:
        ctx = self._ctx
        samples = ctx.backend.sample()
        samples = attribute_processes(samples, self.job_of_pid({p.pid for s in samples for p in s.processes}))
        try:
            await ctx.reporter.report(ev.GpuTelemetry(node_id=ctx.node_id, sampled_at=utcnow(), samples=samples),
                                      topic=NODES_TELEMETRY.name)
        except Exception as exc:  # noqa: BLE001 - telemetry is lossy by design
            log.debug("%s: telemetry dropped (%s)", ctx.node_id, exc)

    def job_of_pid(self, pids: set[int]) -> dict[int, str]:
        """NVML pids -> job ids: a job's processes share its session (the wrapper's pid)."""
        sessions = {r.pid: job_id for job_id, r in self._running.items()}
        mapping = {}
        for pid in pids:
            if pid in sessions:
                mapping[pid] = sessions[pid]
                continue
            try:
                sid = os.getsid(pid)
            except OSError:
                continue
            if sid in sessions:
                mapping[pid] = sessions[sid]
        return mapping
