"""A campaign job: it records its own run, so the checker can see every run that really happened.

Run as ``python -S runjob.py RUNS_DIR SECONDS EXIT_CODE``. It writes ``RUNS_DIR/<job>.<node>.<pid>`` with
one line ``start <job> <attempt> <node> <pid> <wall time> <visible devices> <share milli>``, touches the
file every TICK_S while it runs (so a run killed by SIGKILL is known to have ended within TICK_S of the
file's last modification), and appends ``end <wall time> <exit code>`` when it ends by itself. It imports
nothing of gpusched: it is what a user's job is, a process with an environment.
"""

import os
import sys
import time

TICK_S = 0.2


def main() -> int:
    runs_dir, seconds, code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    env = os.environ
    job, node, attempt = env.get("GPUSCHED_JOB_ID", "?"), env.get("GPUSCHED_NODE_ID", "?"), env.get("GPUSCHED_JOB_ATTEMPT", "?")
    devices = env.get("CUDA_VISIBLE_DEVICES", "") or "-"
    share = env.get("GPUSCHED_GPU_SHARE_MILLI", "") or "-"
    path = os.path.join(runs_dir, f"{job}.{node}.{os.getpid()}")
    started = time.time()
    with open(path, "w") as f:
        f.write(f"start {job} {attempt} {node} {os.getpid()} {started:.6f} {devices} {share}\n")
    while time.time() - started < seconds:
        time.sleep(min(TICK_S, max(0.0, seconds - (time.time() - started))))
        os.utime(path)
    with open(path, "a") as f:
        f.write(f"end {time.time():.6f} {code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
