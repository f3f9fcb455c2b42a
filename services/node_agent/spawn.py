"""Starting a job's process and awaiting its end, for the runner (``runner.JobRunner``).

A job's wrapper starts at a gate (its stdin, a pipe), is moved into the job's cgroups, and only then is the
gate opened, so nothing the job starts escapes its limits. Fork, exec and the cgroup writes block until the
kernel has done them (a few ms each on a busy machine), so the runner calls ``spawn_gated`` in a worker
thread: a node starting many jobs at once starts them side by side. The end of a process is awaited on its
pidfd, with no thread per job.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from services.node_agent.cgroups import JobCgroups, Limits


def spawn_gated(argv: list[str], env: Mapping[str, str], as_user: dict, log_path: Path, cgroups: JobCgroups,
                job_id: str, limits: Limits | None) -> tuple[subprocess.Popen, list[str]] | tuple[None, str]:
    """Start ``argv`` at its gate (output appended to ``log_path``), move it into the job's cgroups, open the
    gate; the process and the limits that could not be applied, or (None, why it did not start). Blocking."""
    output = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    problems = cgroups.prepare(job_id, limits) if limits is not None else []
    gate_in, gate_out = os.pipe()
    try:
        proc = subprocess.Popen(argv, env=env, stdin=gate_in, stdout=output, stderr=output,
                                start_new_session=True, **as_user)  # own process group, for clean stops
    except OSError as exc:
        os.close(gate_out)
        cgroups.remove(job_id)
        return None, f"could not start command: {exc}"
    finally:
        output.close()
        os.close(gate_in)
    try:
        if limits is not None:
            problems += cgroups.enter(job_id, proc.pid)
        try:
            os.write(gate_out, b"go\n")  # in its cgroup: it may run now
        except BrokenPipeError:
            pass  # the wrapper is gone already: its exit is reported as any other
    finally:
        os.close(gate_out)
    return proc, problems


async def exit_of(proc: subprocess.Popen) -> int:
    """The exit status of a child of this process, awaited without a thread: its pidfd becomes readable
    when it ends (Linux 5.3+); elsewhere it is polled."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfds here, or it was reaped already
        while proc.poll() is None:
            await asyncio.sleep(0.2)
        return proc.returncode
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(fd, lambda: ended.done() or ended.set_result(None))
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return proc.wait()
