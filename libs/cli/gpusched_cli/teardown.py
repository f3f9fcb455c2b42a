"""Stopping a local stack's jobs when the stack goes down.

A node agent leaves its jobs running when it stops, so that the agent started next adopts them
(services/node_agent/runner.py). `gpusched down` is different: nothing will adopt them, so once the agents
are stopped it stops every job they recorded that still runs, by its process group (see
`stop_job_groups`). The records are read from the agents' work directories, one per node, under
GPUSCHED_AGENT_WORK_DIR as the stack started its agents with (`<home>/agents` by default); their format
is the contract in gpusched_common/job_records.py, so this module imports no service.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from gpusched_common.infra.processes import alive, stop_pid
from gpusched_core.agent.container import OCI_RUNTIMES
from gpusched_common.job_records import JobRecord, read_records, stop_job_groups

Progress = Callable[[str], None]
WATCHDOG_PID_FILE = "watchdog.pid"  # services/node_agent/watchdog.py PID_FILE (no service is imported here)
JOB_GRACE_S = 5.0  # how long a job has after SIGTERM before its process group is killed


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

    def skipped(path: Path, exc: Exception) -> None:
        progress(f"skipped    {path}: not a readable job record ({type(exc).__name__}: {exc})")

    return [record for node_dir in node_dirs for record in read_records(node_dir, skipped)]


def stop_stack_jobs(home: str | Path, env: dict[str, str], progress: Progress = print,
                    grace_s: float = JOB_GRACE_S) -> int:
    """Stop every job of the stack in `home` that still runs (its agents must be stopped already, or they
    would start more); reports and returns how many were stopped."""
    root = agents_dir(home, env)
    records = job_records(root, progress)
    stopped, killed = stop_job_groups(records, grace_s)
    note = f" ({killed} killed after a {grace_s:g}s grace)" if killed else ""
    progress(f"stopped    {stopped} job process(es){note}")
    containers = remove_containers(root, env)
    if containers:
        progress(f"removed    {containers} job container(s)")
    watchdogs = stop_watchdogs(root)
    if watchdogs:
        progress(f"stopped    {watchdogs} node watchdog(s)")
    return stopped


def remove_containers(root: Path, env: dict[str, str]) -> int:
    """Remove the containers of image jobs whose job directory is under ``root`` (their ``gpusched.dir``
    label): a killed runtime client leaves its container running. The stack's runtime is the agents'
    ``GPUSCHED_AGENT_CONTAINER_RUNTIME`` (auto: podman, else docker; apptainer keeps no container); none installed: nothing to remove."""
    configured = env.get("GPUSCHED_AGENT_CONTAINER_RUNTIME", "auto").strip()
    if configured == "none":
        return 0
    runtime = shlex.split(configured) if configured != "auto" else \
        next(([path] for path in map(shutil.which, OCI_RUNTIMES) if path), [])
    if not runtime or shutil.which(runtime[0]) is None:
        return 0
    try:
        listed = subprocess.run([*runtime, "ps", "--all", "--filter", "label=gpusched.dir", "--format",
                                 "{{.ID}} {{.Labels}}"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    prefix = str(root.resolve())
    ours = [line.split(" ", 1)[0] for line in listed.stdout.splitlines()
            if f"gpusched.dir:{prefix}" in line or f"gpusched.dir={prefix}" in line]
    if ours:
        subprocess.run([*runtime, "rm", "--force", "--time", "0", *ours], capture_output=True, timeout=120)
    return len(ours)


def stop_watchdogs(root: Path) -> int:
    """Stop the agents' watchdogs (each names its pid in ``watchdog.pid`` of the directories it watches;
    services/node_agent/watchdog.py): with the jobs stopped nothing is left for them to watch."""
    pids = set()
    for pid_file in root.glob(f"*/{WATCHDOG_PID_FILE}") if root.is_dir() else []:
        try:
            pids.add(int(pid_file.read_text().strip()))
        except (OSError, ValueError):
            continue
    stopped = 0
    for pid in sorted(pids):
        if alive(pid) and _is_watchdog(pid):  # a pid file outlives its process: never stop a stranger
            stop_pid(pid)
            stopped += 1
    return stopped


def _is_watchdog(pid: int) -> bool:
    try:
        return b"services.node_agent.watchdog" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
