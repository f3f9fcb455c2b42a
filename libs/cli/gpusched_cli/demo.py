"""`gpusched demo` (what `make run` runs): local stack up, a mixed workload, a summary, stack down."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from gpusched_common.db import connect
from gpusched_common.infra.brokers import BROKER_KINDS

from gpusched_cli import stack
from gpusched_cli.queries import summary
from gpusched_common.table import render
from gpusched_cli.workload import demo_workload, progress_line, submit_through_gateway, wait_until_finished

TENANTS = ["research", "inference", "platform", "ml-eval"]


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=240)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpu-models", default="H100-80GB,A100-80GB")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--keep-up", action="store_true", help="leave the stack running afterwards")
    p.add_argument("--broker", choices=BROKER_KINDS, default="tansu",
                   help="tansu: embedded, in memory (default); kafka: Apache Kafka from Maven Central (needs Java)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def cmd_demo(args: argparse.Namespace) -> int:
    return asyncio.run(run_demo(args))


async def run_demo(args: argparse.Namespace) -> int:
    models = args.gpu_models.split(",")
    print(f"starting the local stack: {args.nodes} nodes x {args.gpus_per_node} GPUs ({', '.join(models)})")
    state = await stack.up(nodes=args.nodes, gpu_models=models, gpus_per_node=args.gpus_per_node, broker=args.broker)
    try:
        specs = demo_workload(args.jobs, TENANTS, models)
        started = time.monotonic()
        ids = await asyncio.to_thread(submit_through_gateway, state, specs)
        print(f"submitted {len(ids)} jobs from {len(TENANTS)} tenants through the gateway ({state.gateway}) in "
              f"{time.monotonic() - started:.1f}s")
        await wait_until_finished(state.database_url, ids, timeout_s=args.timeout, progress=progress_line(len(ids)),
                                  interval_s=2.0)
        wall = time.monotonic() - started
        conn = await connect(state.database_url)
        try:
            result = await summary(conn)
        finally:
            await conn.close()
        result["wall_s"] = round(wall, 1)
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print()
            print(render(["STATE", "JOBS"], sorted(result["jobs_by_state"].items())))
            print()
            print(render(["METRIC", "VALUE"], [
                ("jobs", result["jobs"]),
                ("GPUs in cluster", result["gpus_total"]),
                ("GPU allocation (GPU-seconds / capacity)", _pct(result["gpu_allocation_pct"])),
                ("GPU utilization from NVML telemetry", _pct(result["gpu_utilization_telemetry_pct"])),
                ("submit -> placed p50", _ms(result["submit_to_placed_p50_ms"])),
                ("submit -> placed p99", _ms(result["submit_to_placed_p99_ms"])),
                ("wall time", f"{result['wall_s']} s"),
            ]))
        return 0
    finally:
        if not args.keep_up:
            print()
            stack.down(progress=lambda line: None)
            print("local stack stopped")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"
