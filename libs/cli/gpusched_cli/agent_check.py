"""`gpusched agent --check [--json] [--simulated MODEL:COUNT]`: the node's inventory and a few telemetry
samples, read the way the node agent reads them (real NVML, or the simulated backend).

The check belongs to the node agent (services/node_agent/check.py); this command runs it as
`python -m services.node_agent --check ...` with the same flags, and passes on its output and exit code,
so the CLI imports no service module.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

AGENT_MODULE = "services.node_agent"


def add_agent_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("agent", help="node agent tools: --check prints this node's GPUs and telemetry")
    p.add_argument("--check", action="store_true", help="print inventory, health and telemetry samples, then exit")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--simulated", metavar="MODEL:COUNT", help="use the simulated backend, e.g. H100-80GB:8")
    p.add_argument("--samples", type=int, default=3, help="telemetry samples to take (default 3)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples (default 1)")
    p.add_argument("--node-id", default="local")
    p.set_defaults(func=run_agent)
    return p


def run_agent(args: argparse.Namespace) -> int:
    if not args.check:
        print("gpusched agent: only --check is supported here; agents run as `python -m services.node_agent`",
              file=sys.stderr)
        return 2
    done = subprocess.run([sys.executable, "-m", AGENT_MODULE, *check_argv(args)], capture_output=True, text=True,
                          check=False)
    # written through sys.stdout/sys.stderr (not inherited file descriptors), so callers that capture the
    # command's output see the check's
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


def check_argv(args: argparse.Namespace) -> list[str]:
    """The agent's check flags for these parsed arguments (`--flag=value`, so a value may start with `-`)."""
    argv = ["--check", *(["--json"] if args.json else [])]
    if args.simulated:
        argv.append(f"--simulated={args.simulated}")
    return [*argv, f"--samples={args.samples}", f"--interval={args.interval!r}", f"--node-id={args.node_id}"]
