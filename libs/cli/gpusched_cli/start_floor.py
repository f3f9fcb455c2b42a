"""What starting one job's processes costs this machine, the way a node agent starts them (issue 16).

An agent starts each job as a shell in its own session that waits at a gate (its stdin) and then runs the
command (``services/node_agent/runner.py``'s wrapper, ``spawn.py``); a simulated node of ``bench-scale``
runs ``sleep``. That work (fork, exec of the shell, the shell's fork and exec of the command, the kernel's
bookkeeping of two processes) is done on the scheduler's own machine when the nodes are simulated there,
however little the scheduler costs: the machine's CPU seconds per start, measured here on the quiet machine
(before the stack is up) and without cgroups, is a floor under what each placed job costs in the burst, and
``cores * 1000 / floor`` the most jobs a second such a machine could start at all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from gpusched_cli.proc_usage import machine_cpu_s

# the agent's gate and run, without its exit file (nothing here reads it)
_WRAPPER = 'read -r _gate || exit 125; "$@" </dev/null'
SETTLE_S = 0.5  # after the last start, for the shells to exec their commands


def floor_job_start_ms(count: int = 200, command: tuple[str, ...] = ("sleep", "3600"),
                       settle_s: float = SETTLE_S) -> float:
    """Machine CPU milliseconds per job started as an agent starts one (``count`` of them, then stopped), net of
    what the machine did meanwhile before the first start (measured over the same time just before)."""
    before_quiet, quiet_started = machine_cpu_s(), time.monotonic()
    time.sleep(1.0)
    quiet_busy = (machine_cpu_s()[0] - before_quiet[0]) / (time.monotonic() - quiet_started)
    procs: list[subprocess.Popen] = []
    started, begun = machine_cpu_s(), time.monotonic()
    try:
        for _ in range(count):
            gate_in, gate_out = os.pipe()
            try:
                procs.append(subprocess.Popen(["sh", "-c", _WRAPPER, "gpusched-job", *command], stdin=gate_in,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                              start_new_session=True))
                os.write(gate_out, b"go\n")
            finally:
                os.close(gate_in)
                os.close(gate_out)
        time.sleep(settle_s)
        busy = machine_cpu_s()[0] - started[0] - quiet_busy * (time.monotonic() - begun)
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the shell and the command
            except ProcessLookupError:
                pass
        for proc in procs:
            proc.wait()
    return max(busy, 0.0) * 1000 / count
