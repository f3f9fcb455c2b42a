"""The node's dead-man switch (services/node_agent/watchdog.py): jobs of a node whose agent's lease lapsed
are killed by a process of its own, also when the agent itself is paused or dead."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gpusched_core.agent.lease import acquire

from services.node_agent import watchdog
from services.node_agent.runner import JobRunner


async def start_sleeper(runner: JobRunner, job_id: str):
    return await runner.start(job_id, ["sleep", "60"], (0,), {})


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


async def test_the_lease_published_is_the_wall_clock_end_plus_half_the_grace(tmp_path):
    now = time.monotonic()
    watchdog.publish_lease(tmp_path, acquire(3, 30.0, now - 10), fence_grace_s=10.0, monotonic_now=now)
    assert abs(watchdog.lease_until(tmp_path) - (time.time() + 20 + 5)) < 0.5
    watchdog.publish_lease(tmp_path, acquire(3, 0.0, now), fence_grace_s=10.0, monotonic_now=now)
    assert watchdog.lease_until(tmp_path) == float("inf")  # no lease held: nothing lapses


async def test_a_job_of_a_node_whose_lease_lapsed_is_killed_and_one_whose_lease_holds_is_not(tmp_path):
    runner = JobRunner(tmp_path)
    record = await start_sleeper(runner, "j-1")
    now = time.monotonic()
    watchdog.publish_lease(tmp_path, acquire(1, 30.0, now), fence_grace_s=10.0, monotonic_now=now)
    assert watchdog.fence_lapsed(tmp_path, runner, time.time()) == ([], True)
    assert runner.is_alive(record)
    assert watchdog.fence_lapsed(tmp_path, runner, time.time() + 36) == (["j-1"], True)
    wait_until(lambda: not runner.is_alive(record))


async def test_the_watchdog_process_kills_the_jobs_of_a_paused_agent_and_a_second_one_stands_aside(tmp_path):
    runner = JobRunner(tmp_path)
    record = await start_sleeper(runner, "j-1")
    now = time.monotonic()
    watchdog.publish_lease(tmp_path, acquire(1, 1.0, now), fence_grace_s=0.4, monotonic_now=now)
    first = watchdog.ensure([tmp_path])
    assert first is not None
    try:
        wait_until(lambda: watchdog._watched(tmp_path))
        assert watchdog.ensure([tmp_path]) is None  # watched already
        second = subprocess.run([sys.executable, "-m", "services.node_agent.watchdog", str(tmp_path)], timeout=30)
        assert second.returncode == 0  # the lock is the first one's: it exits at once
        # nobody renews the lease (the agent is paused): past it, the job is killed
        wait_until(lambda: not runner.is_alive(record))
    finally:
        first.kill()
        first.wait()
    assert os.path.exists(tmp_path / watchdog.PID_FILE)


def test_a_lease_is_rewritten_in_place_as_one_fixed_record_a_plain_float_reader_still_reads(tmp_path):
    path = tmp_path / watchdog.LEASE_FILE
    path.write_text("1733500000.123456789\n" * 3)  # longer than a record (as an older version never wrote)
    path.chmod(0o644)
    watchdog.write_in_place(path, repr(1733531234.5))
    assert path.stat().st_size == watchdog.LEASE_RECORD + 1
    assert path.stat().st_mode & 0o777 == 0o600
    assert float(path.read_text().strip()) == 1733531234.5  # what the watchdog of the version before does
    inode = path.stat().st_ino
    watchdog.write_in_place(path, repr(float("inf")))
    assert path.stat().st_ino == inode  # the same file, written over: no new file renamed in
    assert watchdog.lease_until(tmp_path) == float("inf")


def test_a_record_too_long_for_the_lease_file_is_refused(tmp_path):
    try:
        watchdog.write_in_place(tmp_path / watchdog.LEASE_FILE, "1" * (watchdog.LEASE_RECORD + 1))
    except ValueError:
        return
    raise AssertionError("a record that would not fit was written")


def reads_giving(monkeypatch, tmp_path, values: list[bytes]) -> list[int]:
    """The lease file's reads give ``values`` in turn (the last one from then on); returns the count of reads."""
    calls = [0]
    real = type(tmp_path).read_bytes

    def read_bytes(self):
        if self.name != watchdog.LEASE_FILE:
            return real(self)
        calls[0] += 1
        return values[min(calls[0], len(values)) - 1]
    monkeypatch.setattr(type(tmp_path), "read_bytes", read_bytes)
    return calls


async def test_a_lease_read_in_the_instant_of_its_write_kills_nothing(tmp_path, monkeypatch):
    runner = JobRunner(tmp_path)
    record = await start_sleeper(runner, "j-1")
    now = time.time()
    # the first read catches the write half done: its digits mix the old time and the new, long past
    torn, future = repr(now - 5000).encode(), repr(now + 30).encode()
    calls = reads_giving(monkeypatch, tmp_path, [torn, future])
    assert watchdog.fence_lapsed(tmp_path, runner, now) == ([], True)
    assert runner.is_alive(record)
    assert calls[0] >= 3  # read again until two reads agreed
    os.killpg(record.pid, 9)


def test_a_lease_file_that_changes_under_every_read_is_not_taken_for_a_time(tmp_path, monkeypatch):
    reads_giving(monkeypatch, tmp_path, [repr(float(n)).encode() for n in range(20)])
    assert watchdog.lease_until(tmp_path, confirm=True) is None
    assert watchdog.lease_until(tmp_path) == 6.0  # a single read takes what it sees (a lease seen to run)
