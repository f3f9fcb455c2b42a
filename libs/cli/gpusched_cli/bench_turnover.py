"""`gpusched bench-turnover` (`make bench-turnover`): how long a GPU stays idle between one job's exit and
the next job's start on it, on a cluster kept full of short jobs (issue 16).

Every GPU of the running local stack gets ``--per-gpu`` one-GPU jobs of ``--run-s`` seconds, submitted at
once, so a job always waits for each GPU that frees. A gap is measured per GPU from what its node agent
reported, on the node's one clock: the next run's start (``JobStarted.started_at``) minus the previous
run's exit (its start plus ``JobSucceeded.runtime_s``). Beside it, the broker's produce -> consume round
trip of the same run: the gap is a chain of hops (the exit report, placement, quota, placement, the
StartJob, the start), each at least one round trip; and where the gaps went, hop by hop, from the store
(``hops.TURNOVER_HOPS``: the exit recorded, the next job reserved, placed, its StartJob published, its start;
``gap_hops_ms``). Results: tables, and bench-results/turnover.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import asyncpg

from gpusched_common import events as ev
from gpusched_common.stores import cluster
from gpusched_common.table import render

from gpusched_cli import stack
from gpusched_cli.bench import floor_broker_rtt_ms
from gpusched_cli.hops import hop_rows, turnover_hops
from gpusched_cli.workload import progress_line, submit_all, wait_until_finished


def add_turnover_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--per-gpu", type=int, default=8, help="jobs per GPU of the cluster (default 8)")
    p.add_argument("--run-s", type=float, default=0.5, help="how long each job runs (default 0.5 s)")
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default="bench-results/turnover.json")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def cmd_turnover(args: argparse.Namespace) -> int:
    state = stack.load()
    if state is None:
        print("gpusched bench-turnover: no local stack is up; run `gpusched up` first (or `make bench-turnover`)")
        return 1
    return asyncio.run(run_turnover(args, state))


def consecutive(runs: list[tuple]) -> list[tuple[tuple, tuple]]:
    """Each GPU's runs in start order, paired one with the next: ``runs`` are (node, GPU index, start, exit, ...)
    with times in seconds of the node's clock."""
    by_gpu: dict[tuple[str, int], list[tuple]] = defaultdict(list)
    for run in runs:
        by_gpu[(run[0], run[1])].append(run)
    pairs = []
    for spans in by_gpu.values():
        spans.sort(key=lambda run: (run[2], run[3]))
        pairs += list(zip(spans, spans[1:], strict=False))
    return pairs


def gaps_ms(runs: list[tuple]) -> list[float]:
    """Idle gaps per GPU: from one run's exit to the next one's start (a negative gap, a start reported before
    the previous exit by a few clock ticks, counts as 0)."""
    return [max(0.0, (nxt[2] - prev[3]) * 1000) for prev, nxt in consecutive(runs)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")


async def _runs(conn: asyncpg.Connection, ids: list[str]) -> list[tuple[str, int, float, float, str, datetime]]:
    """(node, GPU index, start, exit, job id, end recorded) of each run that ended."""
    rows = await conn.fetch(
        "SELECT stream_id, type, payload, recorded_at FROM events WHERE stream_id = ANY($1::text[])"
        " AND type IN ('JobPlaced', 'JobStarted', 'JobSucceeded') ORDER BY global_position", [f"job-{i}" for i in ids])
    placed: dict[str, tuple[str, int]] = {}
    started: dict[str, float] = {}
    runs = []
    for row in rows:
        payload = row["payload"] if isinstance(row["payload"], dict) else json.loads(row["payload"])
        if row["type"] == "JobPlaced":
            placed[row["stream_id"]] = (payload["node_id"], payload["gpu_indices"][0])
        elif row["type"] == "JobStarted":
            started[row["stream_id"]] = ev.JobStarted.model_validate(payload).started_at.timestamp()
        elif row["stream_id"] in placed and row["stream_id"] in started:
            start = started[row["stream_id"]]
            runs.append((*placed[row["stream_id"]], start, start + float(payload["runtime_s"]),
                         row["stream_id"].removeprefix("job-"), row["recorded_at"]))
    return runs


async def _hops(conn: asyncpg.Connection, runs: list[tuple]) -> dict:
    """Where the gaps went, hop by hop (``hops.turnover_hops``)."""
    gaps = [(datetime.fromtimestamp(prev[3], timezone.utc), prev[5], nxt[4]) for prev, nxt in consecutive(runs)]
    return await turnover_hops(conn, gaps)


async def run_turnover(args: argparse.Namespace, state: stack.StackState) -> int:
    settings = stack.client_settings(state)
    conn = await asyncpg.connect(state.database_url)
    try:
        _, gpus = await cluster.counts(conn)
    finally:
        await conn.close()
    if not gpus:
        print("gpusched bench-turnover: the stack has no GPUs registered")
        return 1
    print("measuring the broker's round trip ...")
    rtt = await floor_broker_rtt_ms(state.kafka_bootstrap)
    count = gpus * args.per_gpu
    specs = [ev.JobSpec(tenant=f"turnover-{i % args.tenants}", gpus=1, command=["sleep", f"{args.run_s:g}"],
                        name=f"turnover-{i}") for i in range(count)]
    print(f"submitting {count} one-GPU jobs of {args.run_s:g}s to {gpus} GPUs ...")
    started = time.monotonic()
    ids = await submit_all(settings, specs)
    await wait_until_finished(state.database_url, ids, timeout_s=args.timeout, progress=progress_line(len(ids)),
                              interval_s=1.0)
    wall = time.monotonic() - started
    conn = await asyncpg.connect(state.database_url)
    try:
        runs = await _runs(conn, ids)
        gap_hops = await _hops(conn, runs)
    finally:
        await conn.close()
    gaps = gaps_ms(runs)
    result = {"gpus": gpus, "jobs": count, "run_s": args.run_s, "gaps": len(gaps),
              "exit_to_next_start_p50_ms": round(percentile(gaps, 0.5), 1),
              "exit_to_next_start_p99_ms": round(percentile(gaps, 0.99), 1),
              "exit_to_next_start_mean_ms": round(statistics.fmean(gaps), 1) if gaps else None,
              "jobs_per_s": round(count / wall, 1), "floor_broker_rtt_ms": round(rtt, 2)}
    result["ratio_p50_to_broker_rtt"] = round(result["exit_to_next_start_p50_ms"] / result["floor_broker_rtt_ms"], 1)
    result["gpu_busy_share"] = round(count * args.run_s / (gpus * wall), 3)  # the rest: idle between jobs
    result["gap_hops_ms"] = gap_hops
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print("\n" + render(["METRIC", "VALUE"], [(k, v) for k, v in result.items() if not isinstance(v, dict)]))
        print("\n" + render(["GAP: HOP", "P50 MS", "P90 MS", "P99 MS"], hop_rows(result["gap_hops_ms"])))
    print(f"\nwritten to {out}")
    return 0
