"""Preemptions that went unanswered (issue 15): a victim still Preempting well past its grace (no exit was
reported: its PreemptJob was lost with a broker, say) is asked again, now, on every node of its run; the
agent stops a run once however often it is asked (``gpusched_core.agent.preempt``), and a node that is gone
is the lease's business (placement requeues its jobs)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import asyncpg

from gpusched_common.jobs import load_job
from gpusched_core.lifecycle import JobStatus
from gpusched_core.preemption.jobs import preempt_commands

from services.preemption.store import send_command

log = logging.getLogger(__name__)
SETTLE_S = 30.0  # past the grace: the agent's SIGKILL and its exit report have had time to arrive


class StuckPreemptions:
    """Asks again, at most once per SETTLE_S per job, for the victims no exit was reported for."""

    def __init__(self) -> None:
        self._asked: dict[str, datetime] = {}

    async def ask_again(self, conn: asyncpg.Connection, now: datetime, grace_s: float) -> list[str]:
        rows = await conn.fetch("SELECT job_id FROM jobs WHERE status = $1 AND updated_at < $2 ORDER BY updated_at"
                                " LIMIT 200", JobStatus.PREEMPTING.value, now - timedelta(seconds=grace_s + SETTLE_S))
        self._asked = {j: at for j, at in self._asked.items() if j in {r["job_id"] for r in rows}}
        asked = []
        for row in rows:
            job_id = row["job_id"]
            if job_id in self._asked and now - self._asked[job_id] < timedelta(seconds=SETTLE_S):
                continue
            state = await load_job(conn, job_id)
            if state.status != JobStatus.PREEMPTING:
                continue
            for payload in preempt_commands(state, 0.0, now, "preempted: no exit was reported past the grace; "
                                                             "asked again"):
                await send_command(conn, payload, now)
            self._asked[job_id] = now
            asked.append(job_id)
        if asked:
            log.warning("asked again to stop %d preempted job(s) no exit was reported for: %s", len(asked),
                        ", ".join(asked[:10]))
        return asked
