"""Starting and stopping the processes of a local stack: free loopback ports, detached children with their
output in a log file, and a stop that escalates from SIGTERM to SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from pathlib import Path


_LOWEST_PORT = 20_000


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (their local ports)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback port nothing listens on, for a process started next to listen on. Taken below the kernel's
    ephemeral range where there is room: a port of that range (what binding port 0 gives) may meanwhile become
    the local port of any outgoing connection (to the broker, to PostgreSQL), and the process that was to
    listen there then fails with "address already in use"."""
    low = _ephemeral_low()
    if low - _LOWEST_PORT >= 1_000:
        for _ in range(50):
            port = random.randrange(_LOWEST_PORT, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, timeout_s: float = 20.0, *, pid: int | None = None, log: Path | None = None) -> None:
    """Wait until something listens on 127.0.0.1:port; fails early when `pid` (the process expected to
    listen) has exited, quoting the end of its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(port):
            return
        if pid is not None and not alive(pid):
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"process {pid} exited before listening on 127.0.0.1:{port}\n{tail}")
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


def spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str], *, cwd: Path | None = None) -> int:
    """Start `argv` detached in a session of its own (it outlives the CLI that started it); its output is
    appended to `<log_dir>/<name>.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
    return proc.pid


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie child of ours is reaped and counts as gone)."""
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        if finished:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_pid(pid: int, timeout_s: float = 10.0, *, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send `sig` (SIGTERM) and wait up to `timeout_s` for the process to end, then SIGKILL it."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    while alive(pid):
        time.sleep(0.02)
