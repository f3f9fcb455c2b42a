"""Stopping a local stack's jobs when the stack goes down.

A node agent leaves its jobs running when it stops, so that the agent started next adopts them
(services/node_agent/runner.py). `gpusched down` is different: nothing will adopt them, so once the agents
are stopped it stops every job they recorded that still runs, by its process group (see
`stop_job_groups`). The records are read from the agents' work directories, one per node, under
GPUSCHED_AGENT_WORK_DIR as the stack started its agents with (`<home>/agents` by default).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from services.node_agent.runner import JobRecord, JobRunner, stop_job_groups

Progress = Callable[[str], None]
JOB_GRACE_S = 5.0  # how long a job has after SIGTERM before its process group is killed
# What reading a damaged record may raise: unreadable, not JSON or not UTF-8, or not a record's fields.
_BAD_RECORD = (OSError, ValueError, TypeError, KeyError, AttributeError)


def agents_dir(home: str | Path, env: dict[str, str]) -> Path:
    """The agents' work directory of a stack started in `home` with `env` (StackState.env)."""
    configured = env.get("GPUSCHED_AGENT_WORK_DIR")
    return Path(configured) if configured else Path(home) / "agents"


def job_records(root: Path, progress: Progress = print) -> list[JobRecord]:
    """The job records of every agent work directory under `root`; a record that cannot be read is
    skipped with a message."""
    try:
        node_dirs = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    except OSError as exc:
        progress(f"skipped    job records in {root}: {exc}")
        return []
    records = []
    for node_dir in node_dirs:
        runner = JobRunner(node_dir)
        for path in sorted(node_dir.glob("*.json")):
            try:
                records.append(runner.record(path.stem))
            except _BAD_RECORD as exc:
                progress(f"skipped    {path}: not a readable job record ({type(exc).__name__}: {exc})")
    return [r for r in records if r is not None]


def stop_stack_jobs(home: str | Path, env: dict[str, str], progress: Progress = print,
                    grace_s: float = JOB_GRACE_S) -> int:
    """Stop every job of the stack in `home` that still runs (its agents must be stopped already, or they
    would start more); reports and returns how many were stopped."""
    records = job_records(agents_dir(home, env), progress)
    stopped, killed = stop_job_groups(records, grace_s)
    note = f" ({killed} killed after a {grace_s:g}s grace)" if killed else ""
    progress(f"stopped    {stopped} job process(es){note}")
    return stopped
