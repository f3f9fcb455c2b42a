"""Reporting the checkpoint references jobs write to `$GPUSCHED_CHECKPOINT_FILE`, each new one once."""

from __future__ import annotations

from collections.abc import Iterable

from gpusched_common import events as ev
from gpusched_common.runtime import utcnow

from services.node_agent.context import AgentContext


class Checkpoints:
    def __init__(self, ctx: AgentContext) -> None:
        self._ctx = ctx
        self._reported: dict[str, str] = {}  # job -> last checkpoint reference reported

    def report_new(self, job_ids: Iterable[str]) -> None:
        for job_id in sorted(job_ids):
            self.report(job_id)

    def report(self, job_id: str) -> None:
        """Report the job's checkpoint reference if it changed since the last report."""
        ref = self._ctx.runner.read_checkpoint(job_id)
        if ref is None or self._reported.get(job_id) == ref:
            return
        self._reported[job_id] = ref
        record = self._ctx.runner.record(job_id)
        self._ctx.reporter.in_order(ev.JobCheckpointReported(
            job_id=job_id, node_id=self._ctx.node_id, checkpoint_ref=ref, checkpointed_at=utcnow(),
            lease_epoch=self._ctx.lease.epoch, attempt=record.attempt if record is not None else None))

    def forget(self, job_id: str) -> None:
        self._reported.pop(job_id, None)
