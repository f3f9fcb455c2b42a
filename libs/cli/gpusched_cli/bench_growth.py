"""`gpusched bench-growth` (`make bench-growth`): how the cost of a job grows with the cluster and the queue
(issue 16, part 4).

The scale benchmark's burst (``bench_scale``), run once per cell of ``--nodes`` x ``--jobs``, each cell on a
fresh stack of its own, each for at most ``--window-s`` seconds after its first submission (a cell ends
sooner when no job started for ``--settle-s``). A cell's burst is submitted at once, so its jobs are all
pending at first; those the cluster has no room for (about 3.6 jobs per node of this mix) stay pending.

Per cell: jobs placed (their agent reported the start) and placed jobs/s, submit -> placed p50, CPU
milliseconds per placed job summed over the services (net of the idle cluster), the idle cluster's cores,
and the quota service's memory per job left waiting. The growth columns divide a cell's CPU per job by the
first cell's. A table, and ``bench-results/growth.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

from gpusched_common.infra.brokers import BROKER_KINDS
from gpusched_common.table import render

from gpusched_cli import stack
from gpusched_cli.bench_scale import burst, up_for

COLUMNS = ("nodes", "jobs", "placed", "waiting", "placed_per_s", "submit_to_placed_p50_ms", "cpu_ms_per_job_total",
           "idle_cores_total", "quota_kib_per_waiting_job", "cpu_growth")


def add_growth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", default="100,1000,5000", help="simulated node counts, comma-separated")
    p.add_argument("--jobs", default="1000,10000,50000", help="jobs per burst, comma-separated")
    p.add_argument("--window-s", type=float, default=150.0, help="the longest a cell is measured after its first submission")
    p.add_argument("--settle-s", type=float, default=20.0, help="a cell ends sooner when no job started for this long")
    p.add_argument("--idle-s", type=float, default=10.0, help="seconds each idle cluster is measured first")
    p.add_argument("--telemetry-s", type=float, default=15.0, help="each node's telemetry interval")
    p.add_argument("--health-s", type=float, default=10.0, help="each simulated node's health check interval")
    p.add_argument("--nodes-per-fleet", type=int, default=250, help="simulated nodes per agent process")
    p.add_argument("--broker", choices=BROKER_KINDS, default="tansu")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--out", default="bench-results/growth.json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def parse_counts(text: str) -> list[int]:
    """``"100,1000"`` -> [100, 1000]; a clear error for anything but positive whole numbers."""
    try:
        counts = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not counts or any(c <= 0 for c in counts):
        raise argparse.ArgumentTypeError(f"expected positive counts, got {text!r}")
    return counts


def cell_row(nodes: int, jobs: int, measured: dict) -> dict:
    """One cell's figures, as the table and the JSON show them."""
    return {
        "nodes": nodes, "jobs": jobs, "placed": measured["placed"], "waiting": measured["waiting"],
        "placed_per_s": measured["placed_per_s"], "submit_to_placed_p50_ms": measured["submit_to_placed_p50_ms"],
        "cpu_ms_per_job_total": measured["cpu_ms_per_job_total"], "cpu_ms_per_job": measured["cpu_ms_per_job"],
        "idle_cores_total": measured["idle_cores_total"],
        "quota_kib_per_waiting_job": measured["rss_kib_per_waiting_job"].get("quota"),
        "rss_mib": measured["rss_mib"], "submit_s": measured["submit_s"],
    }


def with_growth(rows: list[dict]) -> list[dict]:
    """Each row with ``cpu_growth``: its CPU per placed job over the first row's (None where either is unknown)."""
    base = rows[0]["cpu_ms_per_job_total"] if rows else None
    return [{**row, "cpu_growth": round(row["cpu_ms_per_job_total"] / base, 2)
             if base and row["cpu_ms_per_job_total"] is not None else None} for row in rows]


async def measure_cell(args: argparse.Namespace, nodes: int, jobs: int, progress: Callable[[str], None]) -> dict:
    cell = argparse.Namespace(nodes=nodes, jobs=jobs, fleet_processes=max(1, -(-nodes // args.nodes_per_fleet)),
                              settle_s=args.settle_s, idle_s=args.idle_s, telemetry_s=args.telemetry_s,
                              health_s=args.health_s, timeout=args.window_s, broker=args.broker, seed=args.seed)
    state = await up_for(cell, progress)
    try:
        return cell_row(nodes, jobs, await burst(cell, state, progress))
    finally:
        stack.down(progress=lambda line: None)


async def run_growth(args: argparse.Namespace, progress: Callable[[str], None] = print) -> list[dict]:
    rows = []
    cells = [(n, j) for n in parse_counts(args.nodes) for j in parse_counts(args.jobs)]
    for i, (nodes, jobs) in enumerate(cells, 1):
        progress(f"cell {i}/{len(cells)}: {jobs} jobs into {nodes} nodes x 8 GPUs")
        rows.append(await measure_cell(args, nodes, jobs, progress))
    return with_growth(rows)


def cmd_growth(args: argparse.Namespace) -> int:
    if stack.load() is not None:
        print("gpusched bench-growth: a stack is up; it starts its own (run `gpusched down` first)")
        return 1
    try:
        parse_counts(args.nodes), parse_counts(args.jobs)
    except argparse.ArgumentTypeError as exc:
        print(f"gpusched bench-growth: {exc}")
        return 2
    os.environ.setdefault("GPUSCHED_KAFKA_SESSION_TIMEOUT_MS", "10000")
    rows = asyncio.run(run_growth(args, progress=lambda line: print(line, flush=True)))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"window_s": args.window_s, "cells": rows}, indent=2) + "\n")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("\n" + render([c.upper() for c in COLUMNS], [tuple(row[c] for c in COLUMNS) for row in rows]))
    print(f"\nwritten to {out}")
    return 0
