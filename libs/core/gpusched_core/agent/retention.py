"""How long an agent keeps the output of jobs it no longer runs (pure): a job's log stays readable through
the gateway for the retention period after its last write, then the agent deletes it with the files of
its finished runs. A job with a current run on the node (its record) is never touched."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_LOG_RETENTION_S = 7 * 86400.0


@dataclass(frozen=True)
class KeptLog:
    job_id: str
    last_write_s: float  # the log's modification time
    current_run: bool  # the job has a record of a run here (running, or ended and not yet set aside)


def expired(logs: Iterable[KeptLog], now_s: float, retention_s: float) -> list[str]:
    """The jobs whose output is past its retention, sorted."""
    return sorted(log.job_id for log in logs if not log.current_run and now_s - log.last_write_s > retention_s)
