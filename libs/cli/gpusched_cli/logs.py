"""Per-job logs for `gpusched logs JOB`: each agent writes a job's stdout and stderr to
`<agent work dir>/<node>/<job>.log`; these functions find and read them.

Wiring (CLI): `add_logs_parser(subparsers)`; the parser's default `func` is `run_logs(args) -> int`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from pathlib import Path

from gpusched_common.ids import is_valid_id


def agents_dir() -> Path:
    """Where agents keep job logs: GPUSCHED_AGENT_WORK_DIR, else the local stack's, else `.gpusched/agents`."""
    explicit = os.environ.get("GPUSCHED_AGENT_WORK_DIR")
    if explicit:
        return Path(explicit)
    from gpusched_cli import stack  # the CLI's own module; imported late: stack imports a lot

    state = stack.load()
    if state is not None and state.env.get("GPUSCHED_AGENT_WORK_DIR"):
        return Path(state.env["GPUSCHED_AGENT_WORK_DIR"])
    return stack.home_dir() / "agents"


def find_job_logs(root: Path, job_id: str, node_id: str | None = None) -> list[Path]:
    """Every log of `job_id` under `root` (one per node it ran on), oldest first."""
    if not is_valid_id(job_id) or (node_id is not None and not is_valid_id(node_id)):
        return []
    nodes = [root / node_id] if node_id else sorted(p for p in root.glob("*") if p.is_dir())
    found = [node / f"{job_id}.log" for node in nodes if (node / f"{job_id}.log").is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def tail_lines(path: Path, lines: int | None) -> list[str]:
    with path.open("r", errors="replace") as f:
        return list(f) if lines is None else list(deque(f, maxlen=lines))


def add_logs_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("logs", help="a job's output (stdout and stderr) from its node agent")
    p.add_argument("job_id")
    p.add_argument("--node", help="only the log from this node")
    p.add_argument("--tail", type=int, help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    p.add_argument("--dir", help="agents' work directory (default: the local stack's)")
    p.set_defaults(func=run_logs)
    return p


def run_logs(args: argparse.Namespace) -> int:
    root = Path(args.dir) if getattr(args, "dir", None) else agents_dir()
    logs = find_job_logs(root, args.job_id, getattr(args, "node", None))
    if not logs:
        print(f"gpusched logs: no log for job {args.job_id} under {root}", file=sys.stderr)
        return 1
    for path in logs:
        if len(logs) > 1:
            print(f"==> {path.parent.name} <==")
        sys.stdout.writelines(tail_lines(path, args.tail))
    if getattr(args, "follow", False):
        return _follow(logs[-1])
    return 0


def _follow(path: Path) -> int:
    with path.open("r", errors="replace") as f:
        f.seek(0, os.SEEK_END)
        try:
            while True:
                line = f.readline()
                if line:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                else:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            return 0
