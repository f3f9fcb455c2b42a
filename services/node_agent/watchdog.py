"""The node's dead-man switch (issue 15): a process of its own, beside the agent, that kills the node's jobs
once the agent's lease has lapsed, also when the agent itself cannot fence them (it is paused, hung, or
dead), so a job placement requeues elsewhere can never still run here.

The agent writes, at each lease it takes and each heartbeat the broker accepts, the wall-clock time its
lease lapses plus half the fencing grace (``lease.until`` in the node's directory): by then the agent has
fenced its jobs itself if it could, and placement declares the node lost only at ttl + grace from the last
heartbeat it received, later still. Past that time the watchdog SIGKILLs every live job's process group.
The agent starts one watchdog per agent process (``ensure``) for all its nodes' directories; each holds a
lock per directory, so a watchdog left by the agent's last life keeps watching and a second one exits. A
watchdog with no live job and no fresh lease left to watch exits by itself.

Run as ``python -m services.node_agent.watchdog DIR...``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpusched_common.files import write_private
from gpusched_common.infra.processes import alive

from gpusched_core.agent.lease import Lease

from services.node_agent.runner import JobRunner

log = logging.getLogger(__name__)

LEASE_FILE = "lease.until"
LOCK_FILE = "watchdog.lock"
PID_FILE = "watchdog.pid"
INTERVAL_S = 0.25
IDLE_EXIT_S = 60.0  # no lease renewed and no live job for this long: nothing left to watch


def publish_lease(work_dir: Path, lease: Lease, fence_grace_s: float, monotonic_now: float) -> None:
    """The wall-clock time past which the node's jobs must not run (``Lease.renewed_at`` is monotonic)."""
    if lease.ttl_s <= 0:  # no lease held: nothing expires
        until = float("inf")
    else:
        until = time.time() - (monotonic_now - lease.renewed_at) + lease.ttl_s + fence_grace_s / 2
    write_in_place(work_dir / LEASE_FILE, repr(until))


LEASE_RECORD = 32  # the lease file's bytes before its newline: a float's repr, padded with spaces


def write_in_place(path: Path, value: str) -> None:
    """Overwrite ``path`` with ``value`` padded to one fixed-size record, in a single write at offset 0 (mode
    0600 from its first byte). Each renewal is one small write in place, not a new file renamed over the old
    one: on ext4 a rename over a file flushes the new file's data first (``auto_da_alloc``), about 50 times
    the cost, and a fleet simulating 1,000 nodes renews 100 leases a second. A reader sees the old record or
    the new one, unless it reads in the instant of the write: ``lease_until`` reads until two reads agree.
    The content stays a float, so a watchdog of the version before reads it as ever."""
    record = value.ljust(LEASE_RECORD).encode() + b"\n"
    if len(record) != LEASE_RECORD + 1:
        raise ValueError(f"a lease record longer than {LEASE_RECORD} bytes: {value!r}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file of another mode, or the umask, cannot widen it
        if os.fstat(fd).st_size != len(record):  # first written here (or by a version that renamed files in)
            os.ftruncate(fd, len(record))
        os.pwrite(fd, record, 0)
    finally:
        os.close(fd)


def lease_until(work_dir: Path, *, confirm: bool = False, attempts: int = 5) -> float | None:
    """The lease file's time; None when there is none or it cannot be read. ``confirm``: read until two reads
    agree, so that a read in the instant of a write (``write_in_place``) is never taken for a time (what a
    watchdog does before it kills on a lapsed lease)."""
    path = work_dir / LEASE_FILE
    try:
        last = path.read_bytes()
        if confirm:
            for _ in range(attempts):
                again = path.read_bytes()
                if again == last:
                    break
                last = again
            else:
                return None  # it changed under every read: the next check reads it again
        return float(last.decode().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def ensure(work_dirs: list[Path]) -> subprocess.Popen | None:
    """Start a watchdog for these directories unless each is watched by a live one already."""
    unwatched = [d for d in work_dirs if not _watched(d)]
    if not unwatched:
        return None
    return subprocess.Popen([sys.executable, "-m", "services.node_agent.watchdog", *map(str, work_dirs)],
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _watched(work_dir: Path) -> bool:
    try:
        return alive(int((work_dir / PID_FILE).read_text().strip()))
    except (OSError, ValueError):
        return False


def fence_lapsed(work_dir: Path, runner: JobRunner, now: float) -> tuple[list[str], bool]:
    """SIGKILL the process group of every live job of a node whose lease lapsed: (the jobs killed, whether
    anything is left to watch: a lease still running or a live job)."""
    until = lease_until(work_dir)
    if until is None or now > until:  # lapsed, or unreadable, as read once: read until sure before killing
        until = lease_until(work_dir, confirm=True)
    if until is not None and now <= until:
        return [], True  # the lease runs: its jobs are not read at all (a fleet's watchdog reads hundreds of nodes)
    live = [r for r in runner.records() if runner.is_alive(r)]
    if until is None:
        return [], bool(live)
    killed = []
    for record in live:
        try:
            os.killpg(record.pid, signal.SIGKILL)
            killed.append(record.job_id)
        except (ProcessLookupError, PermissionError):
            pass
    return killed, bool(live)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watchdog %(levelname)s: %(message)s")
    held: dict[Path, tuple[object, JobRunner]] = {}
    for arg in argv:
        work_dir = Path(arg)
        work_dir.mkdir(parents=True, exist_ok=True)
        lock = open(work_dir / LOCK_FILE, "a")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue  # another watchdog watches it
        write_private(work_dir / PID_FILE, f"{os.getpid()}\n")
        held[work_dir] = (lock, JobRunner(work_dir))
    if not held:
        return 0
    idle_since: float | None = None
    while True:
        now = time.time()
        busy = False
        for work_dir, (_, runner) in held.items():
            killed, watching = fence_lapsed(work_dir, runner, now)
            for job_id in killed:
                log.error("%s: the agent's lease lapsed; killed job %s", work_dir.name, job_id)
            busy |= watching
        idle_since = None if busy else (idle_since or now)
        if idle_since is not None and now - idle_since > IDLE_EXIT_S:
            return 0
        time.sleep(INTERVAL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
