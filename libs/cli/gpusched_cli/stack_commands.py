"""`gpusched up | down | demo | bench-e2e | bench-turnover | bench-scale | bench-growth`: the local stack and what runs on it."""

from __future__ import annotations

import argparse
import asyncio

from gpusched_common.infra.brokers import BROKER_KINDS

from gpusched_cli import stack
from gpusched_cli.bench import add_bench_arguments, cmd_bench
from gpusched_cli.bench_growth import add_growth_arguments, cmd_growth
from gpusched_cli.bench_scale import add_scale_arguments, cmd_scale
from gpusched_cli.bench_turnover import add_turnover_arguments, cmd_turnover
from gpusched_cli.demo import add_demo_arguments, cmd_demo


def add_stack_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("up", help="start the local stack (broker, database, services, simulated agents)")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--gpu-models", default="H100-80GB,A100-80GB", help="models, alternating across nodes")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--keep-data", action="store_true", help="keep the local database from the last run")
    p.add_argument("--broker", choices=BROKER_KINDS, default="tansu",
                   help="tansu: embedded, in memory (default); kafka: Apache Kafka from Maven Central (needs Java)")
    p.add_argument("--fleet", type=int, default=0, metavar="N",
                   help="N more simulated nodes, run as fleets (many nodes per agent process): fleet1-0001, ...")
    p.add_argument("--fleet-processes", type=int, default=1, metavar="K", help="agent processes the fleet is split over")
    p.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop what `up` started").set_defaults(func=cmd_down)


def add_workload_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a demo workload on the local stack and print a summary")
    add_demo_arguments(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench-e2e", help="benchmark the running local stack end to end")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("bench-turnover", help="GPU idle time between jobs on a cluster kept full of short jobs")
    add_turnover_arguments(p)
    p.set_defaults(func=cmd_turnover)

    p = sub.add_parser("bench-scale", help="a burst into 1,000 simulated nodes, then half load (a stack of its own)")
    add_scale_arguments(p)
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("bench-growth", help="the scale burst at several cluster and queue sizes: how cost per job grows")
    add_growth_arguments(p)
    p.set_defaults(func=cmd_growth)


def cmd_up(args: argparse.Namespace) -> int:
    asyncio.run(stack.up(nodes=args.nodes, gpu_models=args.gpu_models.split(","),
                         gpus_per_node=args.gpus_per_node, fresh=not args.keep_data, broker=args.broker,
                         fleet=args.fleet, fleet_processes=args.fleet_processes))
    print("stack is up; `gpusched down` stops it")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stack.down()
    return 0
