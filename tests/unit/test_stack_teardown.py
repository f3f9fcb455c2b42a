"""Stopping a stack's jobs at `down` (libs/cli/gpusched_cli/teardown.py) with real processes: live jobs are stopped
by process group, a reused pid is left alone, a damaged record is skipped with a message."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpusched_cli.teardown import agents_dir, stop_stack_jobs
from gpusched_common.job_records import JobRecord, alive, start_ticks
from services.node_agent.runner import JobRunner


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """A process of the test's own, in a session of its own like a job wrapper, that is no job."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def started() -> Iterator[list[JobRecord]]:
    """The jobs a test starts; any left running when it ends (a failed test) are killed, by group."""
    records: list[JobRecord] = []
    yield records
    for record in records:
        if alive(record.pid, record.proc_start_ticks):
            os.killpg(record.pid, signal.SIGKILL)


def lines() -> tuple[list[str], Callable[[str], None]]:
    out: list[str] = []
    return out, out.append


async def test_live_jobs_are_stopped_by_group_and_a_reused_pid_and_damaged_records_are_left(
        tmp_path, bystander, started):
    runner = JobRunner(tmp_path / "agents" / "node-1")
    jobs = [await runner.start(f"j{i}", ["sh", "-c", "sleep 600 & sleep 600"], (0,), {}) for i in range(3)]
    started.extend(jobs)
    done = await runner.start("done", ["true"], (0,), {})
    await runner.wait(done)
    reused = {**json.loads((runner.work_dir / "j0.json").read_text()), "job_id": "reused", "pid": bystander.pid,
              "proc_start_ticks": start_ticks(bystander.pid) + 1}  # the pid now runs another process
    (runner.work_dir / "reused.json").write_text(json.dumps(reused))
    (runner.work_dir / "torn.json").write_text('{"job_id": "torn", "pid": 12')
    (runner.work_dir / "partial.json").write_text('{"job_id": "partial"}')
    (runner.work_dir / "list.json").write_text("[1, 2]")
    out, progress = lines()

    assert stop_stack_jobs(tmp_path, {}, progress, grace_s=5) == 3

    assert not any(alive(j.pid, j.proc_start_ticks) for j in jobs)
    assert not any(_group_has_members(j.pid) for j in jobs), "a background process of a job survived"
    assert bystander.poll() is None, "a process that reused a recorded pid was signalled"
    skipped = [line for line in out if line.startswith("skipped")]
    assert len(skipped) == 3 and all(name in "".join(skipped) for name in ("torn", "partial", "list")), out
    assert out[-1] == "stopped    3 job process(es)"


async def test_a_job_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, started):
    runner = JobRunner(tmp_path / "agents" / "node-2")
    ready = tmp_path / "ignoring-sigterm"
    job = await runner.start("stubborn", ["sh", "-c", f"trap '' TERM; touch '{ready}'; sleep 600"], (0,), {})
    started.append(job)
    while not ready.exists():  # SIGTERM before the trap would end it politely
        await asyncio.sleep(0.01)
    out, progress = lines()
    assert stop_stack_jobs(tmp_path, {}, progress, grace_s=0.3) == 1
    assert not _group_has_members(job.pid)
    assert out == ["stopped    1 job process(es) (1 killed after a 0.3s grace)"]


def test_a_stack_without_jobs_or_agents_directory_stops_nothing(tmp_path):
    out, progress = lines()
    assert stop_stack_jobs(tmp_path, {"GPUSCHED_AGENT_WORK_DIR": str(tmp_path / "none")}, progress) == 0
    assert out == ["stopped    0 job process(es)"]
    assert agents_dir(tmp_path, {}) == tmp_path / "agents"


def _group_has_members(pgid: int) -> bool:
    """A live (not zombie) process is left in the process group `pgid`."""
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()
        except (OSError, ValueError):
            continue
        if stat[0] != "Z" and stat[2] == str(pgid):
            return True
    return False

