"""``gpusched simulate-preemption``: replay the openb pods in time, without and with preemption.

Wire-up: ``add_simulate_preemption_parser(subparsers)`` adds the sub-command (its ``func`` is
``run_simulate_preemption``); ``main(argv)`` parses and runs it without the gpusched CLI.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpusched_core.placement import build_snapshot, make_policy, policy_names

from ..options import run_standalone
from ..report import stderr_log, write_json
from ..traces.openb import default_nodes_path, default_pods_path
from .engine import Progress, simulate
from .metrics import RunMetrics, arrival_window, comparison, measure, table
from .state import SimConfig
from .workload import SimPod, demand_quantile_gpus, load_cluster, load_timed_pods, runnable

AUTO_QUANTILE = 0.9


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=Path, default=None, help="openb node list CSV (default: GPU nodes)")
    parser.add_argument("--pods", type=Path, default=None, help="openb pod list CSV (default: default trace)")
    parser.add_argument("--gpus", default="auto",
                        help="replay on a proportional sample of the nodes with at least this many GPUs; 0 = all "
                             "nodes; 'auto' = the 90th percentile of GPUs the trace asks for at once, so the "
                             "cluster is short about a tenth of the time (default: auto)")
    parser.add_argument("--policy", default="bestfit", help="placement policy (default: bestfit)")
    parser.add_argument("--mode", choices=("both", "off", "on"), default="both",
                        help="run without preemption, with it, or both (default: both)")
    parser.add_argument("--grace-s", type=float, default=30.0, help="victims' grace period (default: 30)")
    parser.add_argument("--checkpoint-interval-s", type=float, default=600.0,
                        help="jobs checkpoint every this many seconds of progress; 0 = never (default: 600)")
    parser.add_argument("--checkpoint-on-notice", action="store_true",
                        help="victims also checkpoint within their grace period (default: off)")
    parser.add_argument("--restore-s", type=float, default=60.0, help="restore time of a resumed run (default: 60)")
    parser.add_argument("--min-runtime-s", type=float, default=60.0,
                        help="runs of middle and low priority are protected this long (default: 60)")
    parser.add_argument("--max-attempts", type=int, default=4,
                        help="preemption attempts per event time (default: 4)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_simulate_preemption_parser(
    subparsers: argparse._SubParsersAction,  # type: ignore[type-arg]
) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "simulate-preemption", help="replay the openb pods in time, with and without preemption",
        description="Replay the Alibaba openb pods with their creation and deletion times (LS and Guaranteed "
                    "high priority, BE low) and compare high-priority waits, GPU-hours lost, preemptions and "
                    "GPU utilization without and with preemption.")  # fmt: skip
    configure_parser(parser)
    parser.set_defaults(func=run_simulate_preemption)
    return parser


def _config(args: argparse.Namespace, preemption: bool) -> SimConfig:
    return SimConfig(preemption, args.grace_s, args.checkpoint_interval_s, args.checkpoint_on_notice, args.restore_s,
                     args.min_runtime_s, args.max_attempts)  # fmt: skip


def _progress(label: str, log: Callable[[str], None]) -> Progress:
    def report(now_s: float, arrived: int, pending: int) -> None:
        log(f"  {label}: day {now_s / 86400:6.1f}, {arrived} pods arrived, {pending} pending")

    return report


def _target_gpus(text: str, pods: list[SimPod]) -> int:
    if str(text).strip() == "auto":
        return math.ceil(demand_quantile_gpus(pods, arrival_window(pods), AUTO_QUANTILE))
    value = int(text)
    if value < 0:
        raise ValueError(f"--gpus must be 'auto' or >= 0, got {value}")
    return value


def run_simulate_preemption(args: argparse.Namespace) -> int:
    """Run the sub-command; returns the exit status."""
    nodes_path, pods_path = args.nodes or default_nodes_path(), args.pods or default_pods_path()
    if args.policy not in policy_names():
        known = ", ".join(policy_names())
        print(f"simulate-preemption: unknown policy {args.policy!r}; known: {known}", file=sys.stderr)
        return 2
    try:
        every_pod = load_timed_pods(pods_path)
        target = _target_gpus(args.gpus, every_pod)
        nodes = load_cluster(nodes_path, target)
        pods, never = runnable(nodes, every_pod)
    except (OSError, ValueError, KeyError) as error:
        print(f"simulate-preemption: {error}", file=sys.stderr)
        return 2
    capacity = build_snapshot(nodes).gpu_milli_capacity
    window = arrival_window(pods)
    high = sum(1 for pod in pods if pod.high)
    log = stderr_log(args.quiet)
    log(f"{len(pods)} pods ({high} high priority; {len(never)} left out: they fit no node) on {len(nodes)} "
        f"nodes, {capacity // 1000} GPUs; utilization window days {window[0] / 86400:.1f}-{window[1] / 86400:.1f}")
    modes = {"both": (False, True), "off": (False,), "on": (True,)}[args.mode]
    runs: list[RunMetrics] = []
    for preemption in modes:
        began = time.perf_counter()
        label = "with preemption" if preemption else "without preemption"
        state = simulate(nodes, pods, make_policy(args.policy), _config(args, preemption), window,
                         _progress(label, log))  # fmt: skip
        runs.append(measure(state, pods, capacity, time.perf_counter() - began))
    print(f"trace {pods_path.stem}: {len(pods)} pods on {len(nodes)} nodes ({capacity // 1000} GPUs), "
          f"policy {args.policy}")
    print(table(runs))
    for line in comparison(runs):
        print(line)
    if args.json_path is not None:
        write_json(args.json_path, {"runs": [run.as_json() for run in runs]})
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_standalone("gpusched simulate-preemption", configure_parser, run_simulate_preemption, argv)
