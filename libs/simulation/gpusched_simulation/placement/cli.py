"""``gpusched simulate``: replay an openb trace under the published FGD protocol.

Wire-up: ``add_simulate_parser(subparsers)`` adds the sub-command, ``run_simulate(args)`` runs it
and returns the exit status; ``main(argv)`` parses and runs it without the gpusched CLI.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpusched_core.placement import policy_infos, policy_names, workload_from_requests

from ..options import parse_names, run_standalone
from ..report import write_json
from ..traces.openb import default_nodes_path, default_pods_path, load_nodes, load_pods, published_dir
from .replay import replay
from .report import RunResult, document, summarise, table
from .variants import make_variant, parse_variant

DEFAULT_SEEDS = "42-51"
DEFAULT_POLICIES = "bestfit,fgd,ours"


def parse_seeds(text: str) -> list[int]:
    """``42-44`` -> [42, 43, 44]; ``42,45`` -> [42, 45]; mixtures like ``42-44,50`` too."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = part.split("-", 1)
            start, end = int(low), int(high)
            if end < start:
                raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
            seeds.extend(range(start, end + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return list(dict.fromkeys(seeds))


def parse_policies(text: str) -> list[str]:
    return parse_names(text, policy_names())


def add_simulate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add ``simulate`` to an argparse sub-parsers object; returns the new parser."""
    parser = subparsers.add_parser(
        "simulate",
        help="replay an Alibaba openb trace and compare placement policies",
        description="Replay an openb trace under the published FGD protocol (shuffle per seed, inflate "
        "to 130%% of GPU capacity, no departures) and report unallocated GPU %% per policy.",
    )
    configure_parser(parser)
    return parser


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=Path, default=None, help="node list CSV (default: openb GPU nodes)")
    parser.add_argument("--pods", type=Path, default=None, help="pod list CSV (default: openb default trace)")
    parser.add_argument("--variant", default=None,
                        help="generate a trace variant of the FGD paper from --pods (default trace): e.g. "
                        "gpuspec25, gpushare60, multigpu30, cpu200 (see gpusched_simulation.placement.variants)")
    parser.add_argument("--variant-seed", type=int, default=0, help="seed of the variant generator (default: 0)")
    parser.add_argument("--policy", default=DEFAULT_POLICIES,
                        help=f"comma list of policies or 'all' (default: {DEFAULT_POLICIES})")  # fmt: skip
    parser.add_argument("--seeds", default=DEFAULT_SEEDS, help="e.g. 42-44 or 42,45 (default: 42-51)")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--list-policies", action="store_true", help="print the registered policies")
    parser.add_argument("--published-dir", type=Path, default=None, help="FGD published results folder")
    parser.add_argument("--hashed-ties", action="store_true",
                        help="break score ties by seeded hash instead of the seed's node order")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _list_policies() -> int:
    for info in policy_infos():
        mark = f"  [published baseline: {info.published_as}]" if info.published_as else ""
        own = "  [ours]" if info.own else ""
        print(f"{info.name}{mark}{own}")
    return 0


def _progress(label: str, quiet: bool):  # noqa: ANN202
    state = {"last": 0.0}

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if quiet or (done < total and now - state["last"] < 1.0):
            return
        state["last"] = now
        end = "\n" if done >= total else "\r"
        sys.stderr.write(f"  {label}: {done}/{total} pods{end}")
        sys.stderr.flush()

    return report


def run_simulate(args: argparse.Namespace) -> int:
    """Run the ``simulate`` sub-command; returns the process exit status."""
    if args.list_policies:
        return _list_policies()
    try:
        policies = parse_policies(args.policy)
        seeds = parse_seeds(args.seeds)
        variant = parse_variant(args.variant) if args.variant else None
    except (argparse.ArgumentTypeError, ValueError) as error:
        print(f"simulate: {error}", file=sys.stderr)
        return 2
    nodes_path = args.nodes or default_nodes_path()
    pods_path = args.pods or default_pods_path()
    for path in (nodes_path, pods_path):
        if not path.is_file():
            print(f"simulate: no such file: {path}", file=sys.stderr)
            return 2
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    trace = pods_path.stem
    if variant is not None:
        pods = make_variant(pods, variant.name, args.variant_seed)
        print(f"variant {variant.name} generated from {trace} (generator seed {args.variant_seed})")
        trace = f"openb_pod_list_{variant.name}"  # the published figure it is compared with
    workload = workload_from_requests(pod.request for pod in pods)
    results: list[RunResult] = []
    for policy in policies:
        for seed in seeds:
            started = time.monotonic()
            progress = _progress(f"{policy} seed {seed}", args.quiet)
            log = replay(nodes, pods, policy, seed, workload, progress, hashed_ties=args.hashed_ties)
            results.append(RunResult(log, time.monotonic() - started))
    infos = {info.name: info for info in policy_infos()}
    node_list = nodes_path.stem
    summary, best_own = summarise(results, infos, trace, args.published_dir or published_dir())
    print(f"trace {trace} on {node_list}, seeds {seeds[0]}..{seeds[-1]} ({len(seeds)})")
    print(table(results, summary))
    if best_own:
        print(f"best own policy: {best_own}")
    if args.json_path is not None:
        write_json(args.json_path, document(trace, node_list, results, summary, best_own))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_standalone("gpusched simulate", configure_parser, run_simulate, argv)
