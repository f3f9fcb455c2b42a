"""``gpusched simulate-estimates``: how far start-time estimates are from the actual starts, on the Philly
trace (virtual clusters as tenants, quotas as ``simulate-queue`` sets them) replayed through the live cores.

Wire-up: ``add_simulate_estimates_parser(subparsers)``; ``main(argv)`` runs it without the gpusched CLI."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

from gpusched_common.table import render
from gpusched_core.estimates import EstimateConfig, FinishedRun

from ..options import run_standalone
from ..queue.cluster import FLAVOR
from ..queue.policies import DEFAULT_HALF_LIFE_S
from ..queue.quota import quota_setup, quota_weights, schedulable, tenancy_for
from ..report import stderr_log, write_json
from ..traces.philly import default_trace_path, default_vc_path, read_rows, read_vc_nodes, resolve_start, window
from ..whatif.cluster import ReplayNode
from ..whatif.engine import ReplayJob
from .evaluate import WAIT_BUCKETS, accuracy, evaluate


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", type=Path, default=None, help="Philly job CSV (default: shared philly.csv)")
    parser.add_argument("--start", default="auto", help="window start: auto, trace or an ISO date (default: auto)")
    parser.add_argument("--days", type=float, default=7.0, help="window length in days (default: 7)")
    parser.add_argument("--nodes", type=int, default=32, help="8-GPU nodes (default: 32, contended)")
    parser.add_argument("--every-h", type=float, default=2.0, help="hours between sampled instants (default: 2)")
    parser.add_argument("--placement", default="bestfit", help="placement policy (default: bestfit)")
    parser.add_argument("--statistic", choices=("median", "mean"), default="median",
                        help="of the tenants' past run-times (default: median)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def add_simulate_estimates_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "simulate-estimates", help="accuracy of start-time estimates on a replayed Philly trace",
        description="Replay Philly jobs through the quota and placement cores; at sampled instants estimate "
                    "every waiting job's start (gpusched_core.estimates) and compare with its actual start.")
    configure_parser(parser)
    parser.set_defaults(func=run_simulate_estimates)
    return parser


def _h(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.0f} min"


def table(doc: dict) -> str:
    rows = []
    for label, key in ((f"history {doc['statistic']}s", "estimates"), ("true run-times (oracle)", "oracle")):
        figures = doc[key]
        for bucket, e in (("all", figures["overall"]), *figures["by_wait"].items()):
            rows.append((label, bucket, e["n"], _h(e["median_abs_error_s"]), _h(e["p90_abs_error_s"]),
                         "-" if e["optimistic_pct"] is None else f"{e['optimistic_pct']:.0f}%"))
    return render(["RUN-TIMES", "ACTUAL WAIT LEFT", "N", "MEDIAN |ERR|", "P90 |ERR|", "STARTED LATER"], rows)


def run_simulate_estimates(args: argparse.Namespace) -> int:
    log = stderr_log(args.quiet)
    try:
        rows = read_rows(args.trace or default_trace_path())
        start = resolve_start(rows, args.start)
        vc_nodes = read_vc_nodes(default_vc_path())
    except (OSError, ValueError) as error:
        print(f"simulate-estimates: {error}", file=sys.stderr)
        return 2
    workload = window(rows, start, args.days)
    gpus = args.nodes * 8
    tenancy = tenancy_for(quota_setup(quota_weights(workload, "nodes", vc_nodes), gpus, 50.0), DEFAULT_HALF_LIFE_S)
    trace, dropped = schedulable(workload.jobs, tenancy, gpus)
    jobs = [ReplayJob(j.job_id, j.tenant, j.gpus, None, 0, j.arrival_s, j.duration_s) for j in trace]
    nodes = [ReplayNode(f"node-{i:04d}", FLAVOR, 8) for i in range(args.nodes)]
    log(f"{len(jobs)} jobs ({dropped} never fit) from {start:%Y-%m-%d} over {args.days:g} days on {args.nodes} x 8 "
        f"GPUs; estimating every {args.every_h:g} h ...")
    began = time.perf_counter()
    config = EstimateConfig(statistic=args.statistic)
    state, samples = evaluate(jobs, nodes, tenancy, args.every_h * 3600.0, args.placement, config,
                              _before(rows, start, config.history_s))
    doc = {"trace": "philly", "statistic": args.statistic, "start": start.isoformat(), "days": args.days, "nodes": args.nodes, "jobs": len(jobs),
           "instants": len({s.at_s for s in samples}), "wait_buckets": [b[2] for b in WAIT_BUCKETS],
           "estimates": accuracy(state, samples), "oracle": accuracy(state, samples, oracle=True),
           "runtime_sources": _sources(samples), "wall_s": round(time.perf_counter() - began, 1)}
    log(f"  {len(samples)} estimates at {doc['instants']} instants in {doc['wall_s']:.0f} s")
    print(table(doc))
    if args.json_path is not None:
        write_json(args.json_path, doc)
    return 0


def _before(rows, start, history_s: float) -> list[FinishedRun]:
    """The trace's runs submitted in the ``history_s`` before the window, ending when they ended (seconds
    from the window's start: a run still going at the start counts once it has ended)."""
    prior = window(rows, start - timedelta(seconds=history_s), history_s / 86400.0)
    return [FinishedRun(j.tenant, float(j.gpus), None, j.duration_s, j.arrival_s - history_s + j.duration_s)
            for j in prior.jobs]


def _sources(samples) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in samples:
        kind = s.runtime_source.split(" of ")[0]
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    return run_standalone("gpusched simulate-estimates", configure_parser, run_simulate_estimates, argv)


if __name__ == "__main__":
    sys.exit(main())
