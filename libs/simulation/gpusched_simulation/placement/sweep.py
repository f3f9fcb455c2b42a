"""A sweep of placement policies over the FGD paper's traces: shared ones and generated variants.

Run: ``python -m gpusched_simulation.placement.sweep [--traces all] [--policies fgd,ours] [--seeds 42-44]
[--jobs 2] [--markdown out.md] [--json out.json]``. A trace is ``shared:<name>`` (the pod list
``openb_pod_list_<name>.csv`` of the shared traces) or a variant name (generated from the default
trace by ``variants.make_variant``). Each (trace, policy, seed) is one replay under the published
protocol; the table gives the median unallocated GPU % at 100% arrived beside FGD's published median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpusched_core.placement import workload_from_requests

from ..traces.openb import TracePod, default_nodes_path, default_pods_path, load_nodes, load_pods, published_dir
from .cli import parse_policies, parse_seeds
from .metrics import unallocated_pct
from .published import published_unallocated
from .replay import replay
from .variants import PUBLISHED_VARIANTS, make_variant

SHARED = ("default", "cpu050", "gpushare40", "multigpu20", "gpuspec10")
ALL_TRACES = tuple(f"shared:{name}" for name in SHARED) + PUBLISHED_VARIANTS


def trace_pods(trace: str, variant_seed: int = 0) -> list[TracePod]:
    if trace.startswith("shared:"):
        return load_pods(default_pods_path().with_name(f"openb_pod_list_{trace.split(':', 1)[1]}.csv"))
    return make_variant(load_pods(default_pods_path()), trace, variant_seed)


def published_name(trace: str) -> str:
    return f"openb_pod_list_{trace.split(':', 1)[-1]}"


def run_one(trace: str, policy: str, seed: int, variant_seed: int = 0) -> dict[str, object]:
    """One replay; returns the unallocated GPU % at 100% arrived and the run's time."""
    started = time.monotonic()
    pods = trace_pods(trace, variant_seed)
    nodes = load_nodes(default_nodes_path())
    log = replay(nodes, pods, policy, seed, workload_from_requests(p.request for p in pods))
    value = unallocated_pct(log.arrived_milli, log.allocated_milli, log.capacity_milli).get("100")
    return {"trace": trace, "policy": policy, "seed": seed, "unallocated_at_100": value,
            "wall_s": round(time.monotonic() - started, 1)}  # fmt: skip


def _median(runs: list[dict[str, object]], trace: str, policy: str) -> float | None:
    values = [r["unallocated_at_100"] for r in runs if r["trace"] == trace and r["policy"] == policy]
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None  # type: ignore[type-var]


def markdown(runs: list[dict[str, object]], traces: list[str], policies: list[str], seeds: list[int]) -> str:
    """One row per trace: each policy's median, FGD's published median and ours - published."""
    head = ["trace", "seeds", *policies, "published FGD", "ours - published"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for trace in traces:
        medians = [_median(runs, trace, policy) for policy in policies]
        figure = published_unallocated(published_dir(), published_name(trace), "06-FGD")
        ours = medians[policies.index("ours")] if "ours" in policies else None
        delta = f"{ours - figure.median:+.2f}" if figure and ours is not None else "-"
        count = min(len({r["seed"] for r in runs if r["trace"] == trace and r["policy"] == p}) for p in policies)
        cells = [trace, str(count), *(f"{m:.2f}" if m is not None else "-" for m in medians),
                 f"{figure.median:.2f}" if figure else "-", delta]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\nseeds {','.join(map(str, seeds))}; median unallocated GPU % at 100% arrived over a trace's seeds")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpusched_simulation.placement.sweep")
    parser.add_argument("--traces", default="all", help="comma list (shared:<name> or a variant) or 'all'")
    parser.add_argument("--policies", default="fgd,ours")
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--variant-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--json", dest="json_path", type=Path, default=None)
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="no runs: the table of earlier --json files together (for the traces given)")
    args = parser.parse_args(argv)
    if args.merge:
        return _merge(args)
    traces = list(ALL_TRACES) if args.traces == "all" else [t.strip() for t in args.traces.split(",") if t.strip()]
    policies, seeds = parse_policies(args.policies), parse_seeds(args.seeds)
    jobs = [(t, p, s, args.variant_seed) for t in traces for p in policies for s in seeds]
    runs: list[dict[str, object]] = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for run in pool.map(run_one, *zip(*jobs, strict=True)):
            runs.append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
    text = markdown(runs, traces, policies, seeds)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text)
    if args.json_path is not None:
        args.json_path.write_text(json.dumps(runs, indent=1))
    return 0


def _read_runs(path: Path) -> list[dict[str, object]]:
    """Runs of a --json file, or of a sweep's stderr (one JSON run per line)."""
    text = path.read_text()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _merge(args: argparse.Namespace) -> int:
    runs = [run for path in args.merge for run in _read_runs(path)]
    present = list(dict.fromkeys(str(r["trace"]) for r in runs))
    traces = [t for t in ALL_TRACES if t in present] + [t for t in present if t not in ALL_TRACES]
    if args.traces != "all":
        traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    policies = parse_policies(args.policies)
    seeds = sorted({int(r["seed"]) for r in runs})  # type: ignore[call-overload]
    text = markdown(runs, traces, policies, seeds)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
