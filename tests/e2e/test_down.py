"""`gpusched down` on a real local stack leaves no process of it behind: not its services, agents and broker,
and not its jobs either (an agent leaves its jobs running for the next agent to adopt, so `down` must stop
them itself). "Of the stack" is checked two ways: the PIDs the stack and its agents recorded, and every
process on the machine whose environment or working directory points into the stack's home."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpusched_common.db import drop_database
from gpusched_cli import stack
from gpusched_cli.client import Client
from gpusched_cli.teardown import agents_dir, job_records
from tests.builders import a_job
from tests.e2e.test_preemption import wait_for_status

NODES, GPUS_PER_NODE = 2, 4  # four 2-GPU jobs fill both nodes, so both agents have jobs to leave behind
BROKER_BEHAVIOUR = True  # each broker's own processes (a JVM for Apache Kafka) must go too: part of `make test`


@pytest.fixture
async def own_stack(tmp_path: Path, broker_kind: str, pg_server: str,
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[stack.StackState]:
    """A stack of the test's own (the test takes it down); whatever of it is left at the end is killed."""
    home = tmp_path / "stack"
    monkeypatch.setenv("GPUSCHED_HOME", str(home))
    state = None
    try:
        state = await stack.up(nodes=NODES, gpu_models=["H100-80GB"], gpus_per_node=GPUS_PER_NODE,
                               database_name=f"gpusched_e2e_{uuid.uuid4().hex[:8]}", progress=lambda line: None,
                               broker=broker_kind, pg_server=pg_server,
                               extra_env={"GPUSCHED_KAFKA_SESSION_TIMEOUT_MS": "2000"})
        yield state
    finally:
        stack.down(progress=lambda line: None)  # a no-op once the test took the stack down
        for pid in processes_of(home):  # only after a failure: don't leak the stack into the machine
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if state is not None:
            await drop_database(state.database_url)


async def test_down_stops_the_services_agents_broker_and_every_running_job(own_stack):
    state = own_stack
    async with Client(stack.client_settings(state)) as client:
        jobs = [await client.submit(a_job("x").tenant(tenant).gpus(2).model("H100-80GB").command(*command).spec())
                for tenant in ("research", "inference")
                for command in (("sleep", "600"), ("sh", "-c", "sleep 600 & sleep 600"))]
    await wait_for_status(state.database_url, jobs, "Running")
    records = job_records(agents_dir(state.home, state.env))
    assert sorted(r.job_id for r in records) == sorted(jobs)
    assert {Path(state.home, "agents", node) for node in state.node_ids} == {
        p.parent for p in Path(state.home, "agents").glob("*/*.json")}, "every agent runs a job"
    before = processes_of(Path(state.home))
    recorded = [*state.processes.values(), state.running_broker.pid, *(r.pid for r in records)]
    assert set(recorded) <= set(before), "the /proc scan misses processes of the stack"
    assert len(before) >= len(recorded) + len(records), "each job runs a command beside its wrapper"

    out: list[str] = []
    assert stack.down(progress=out.append)

    assert_nothing_left(Path(state.home), before)
    assert f"stopped    {len(jobs)} job process(es)" in out, out


async def test_down_after_the_jobs_exited_skips_a_damaged_record_and_stops_the_rest(own_stack):
    state = own_stack
    async with Client(stack.client_settings(state)) as client:
        jobs = [await client.submit(a_job("x").tenant("research").gpus(1).command("true").spec()) for _ in range(2)]
    await wait_for_status(state.database_url, jobs, "Succeeded")
    torn = Path(state.home, "agents", state.node_ids[0], "torn.json")
    torn.write_text('{"job_id": "torn", "pid": 4')  # as a crash in the middle of writing a record leaves it
    before = processes_of(Path(state.home))

    out: list[str] = []
    assert stack.down(progress=out.append)

    assert "stopped    0 job process(es)" in out, out
    assert any(line.startswith("skipped") and str(torn) in line for line in out), out
    assert not Path(state.home, "stack.json").exists()
    assert_nothing_left(Path(state.home), before)


def assert_nothing_left(home: Path, before: dict[int, int]) -> None:
    survivors = {pid for pid, ticks in before.items() if _live_ticks(pid) == ticks} | set(processes_of(home))
    assert not survivors, {pid: _cmdline(pid) for pid in survivors}


def processes_of(home: Path) -> dict[int, int]:
    """pid -> start ticks of every live process, but this one, whose environment (as it was started) or
    working directory points into `home`."""
    marker = str(home)
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:  # gone, or a zombie
            continue
        ticks = _live_ticks(pid)
        if ticks is not None and (marker.encode() in environ or cwd == marker or cwd.startswith(marker + os.sep)):
            found[pid] = ticks
    return found


def _live_ticks(pid: int) -> int | None:
    """The start time (clock ticks after boot) of process `pid`, None when it is gone or a zombie; with
    the pid it names one process, whatever later reuses the pid."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"
