"""``gpusched simulate-queue``: replay the Philly trace through the quota core under several policies.

Wire-up: ``add_simulate_queue_parser(subparsers)`` adds the sub-command (its ``func`` is
``run_simulate_queue``); ``main(argv)`` parses and runs it without the gpusched CLI.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..options import parse_names, run_standalone
from ..report import stderr_log, write_json
from ..traces.philly import default_trace_path, default_vc_path, read_rows, read_vc_nodes, resolve_start, window
from .engine import SimConfig
from .policies import (
    DEFAULT_FAIR_PREEMPTION_MARGIN,
    DEFAULT_FAIR_QUANTUM_S,
    DEFAULT_HALF_LIFE_S,
    DEFAULT_LAS_THRESHOLD_GPU_S,
    DEFAULT_POLICY,
    POLICY_NAMES,
    make_policies,
)
from .quota import quota_setup, quota_weights
from .report import comparison, document, table
from .run import run_all


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default="all",
                        help=f"comma list of {', '.join(POLICY_NAMES)} or 'all' (default: all)")
    parser.add_argument("--trace", type=Path, default=None, help="Philly job CSV (default: shared philly.csv)")
    parser.add_argument("--vc-file", type=Path, default=None, help="VC node counts (default: helios philly_vc.csv)")
    parser.add_argument("--start", default="auto",
                        help="window start: 'auto' (first day with 100+ arrivals), 'trace' (first timestamp) "
                             "or an ISO date (default: auto)")
    parser.add_argument("--days", type=float, default=7.0, help="window length in days (default: 7)")
    parser.add_argument("--max-jobs", type=int, default=None, help="only the first N jobs of the window")
    parser.add_argument("--nodes", type=int, default=64, help="nodes (default: 64)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: 8)")
    parser.add_argument("--quota-basis", choices=("nodes", "gpu-hours"), default="nodes",
                        help="nominal quota in proportion to philly_vc.csv nodes or to window GPU-hours")
    parser.add_argument("--borrow-limit-pct", default="50",
                        help="each tenant may borrow up to this %% of the cluster, or 'none' for no limit "
                             "(default: 50)")
    parser.add_argument("--half-life-s", type=float, default=DEFAULT_HALF_LIFE_S,
                        help=f"fair-share usage half-life of the default policy (default: {DEFAULT_HALF_LIFE_S:g})")
    parser.add_argument("--las-threshold-gpu-s", type=float, default=DEFAULT_LAS_THRESHOLD_GPU_S,
                        help="GPU-seconds after which a job drops to the second LAS queue (default: 3600)")
    parser.add_argument("--fair-margin", default=f"{DEFAULT_FAIR_PREEMPTION_MARGIN:g}",
                        help="the default policy preempts tenants whose fair share is over the waiting tenant's "
                             "by more than this fraction, or 'none' for no fair-share preemption (nor fair backfill) "
                             f"(default: {DEFAULT_FAIR_PREEMPTION_MARGIN:g})")
    parser.add_argument("--fair-quantum-s", type=float, default=DEFAULT_FAIR_QUANTUM_S,
                        help=f"a run is not preempted by fair share before this (default: {DEFAULT_FAIR_QUANTUM_S:g})")
    parser.add_argument("--preempt-overhead-s", type=float, default=60.0,
                        help="checkpoint-restore time added to every resumed run (default: 60)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_simulate_queue_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "simulate-queue", help="replay the Philly trace through quota and fair-share policies",
        description="Replay Philly jobs (virtual clusters as tenants) with a virtual clock under quota, "
                    "fair-share and queueing policies; report JCT, waits, utilization, fairness.")
    configure_parser(parser)
    parser.set_defaults(func=run_simulate_queue)
    return parser


def _borrow(text: str) -> float | None:
    return None if text.strip().lower() == "none" else float(text)


def run_simulate_queue(args: argparse.Namespace) -> int:
    """Run the sub-command; returns the exit status."""
    log = stderr_log(args.quiet)
    try:
        names = parse_names(args.policy, POLICY_NAMES)
        borrow = _borrow(args.borrow_limit_pct)
        fair_margin = _borrow(args.fair_margin)
        rows = read_rows(args.trace or default_trace_path())
        start = resolve_start(rows, args.start)
        vc_nodes = read_vc_nodes(args.vc_file or default_vc_path())
    except (OSError, ValueError, argparse.ArgumentTypeError) as error:
        print(f"simulate-queue: {error}", file=sys.stderr)
        return 2
    workload = window(rows, start, args.days, args.max_jobs)
    if not workload.jobs:
        print(f"simulate-queue: no jobs in {args.days:g} days from {start}", file=sys.stderr)
        return 2
    gpus = args.nodes * args.gpus_per_node
    setup = quota_setup(quota_weights(workload, args.quota_basis, vc_nodes), gpus, borrow)
    config = SimConfig(args.nodes, args.gpus_per_node, args.las_threshold_gpu_s, args.preempt_overhead_s)
    policies = make_policies(args.half_life_s, fair_margin, args.fair_quantum_s)
    began = time.perf_counter()
    log(f"{len(workload.jobs)} jobs from {start:%Y-%m-%d %H:%M} over {args.days:g} days on "
        f"{args.nodes} x {args.gpus_per_node} GPUs; quotas by {args.quota_basis}: "
        + ", ".join(f"{t}={g}" for t, g in sorted(setup.nominal_gpus.items())))
    results = run_all(workload, setup, [policies[n] for n in names], config, log)
    default = DEFAULT_POLICY if DEFAULT_POLICY in results else names[0]
    print(table(default, results))
    for line in comparison(default, results):
        print(line)
    log(f"total wall time {time.perf_counter() - began:.1f} s")
    if args.json_path is not None:
        write_json(args.json_path, document(default, results))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_standalone("gpusched simulate-queue", configure_parser, run_simulate_queue, argv)
