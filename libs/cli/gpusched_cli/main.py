"""`gpusched`: the command line for users and operators. Each command group has its module; this one
builds the parser from them and runs the command."""

from __future__ import annotations

import argparse
import sys

from gpusched_cli.agent_check import add_agent_parser
from gpusched_cli.chaos.campaign import add_chaos_parser
from gpusched_cli.deadletter import add_deadletter_parsers
from gpusched_cli.enrolment import add_enrolment_parsers
from gpusched_cli.job_commands import add_job_parsers
from gpusched_cli.node_commands import add_node_parsers
from gpusched_cli.logs import add_logs_parser
from gpusched_cli.ops_commands import add_ops_parsers
from gpusched_cli.stack_commands import add_stack_parsers, add_workload_parsers
from gpusched_cli.producers import add_producers_parser
from gpusched_cli.provision import add_provision_parsers
from gpusched_cli.tenants import add_tenants_parser
from gpusched_cli.tokens import add_tokens_parser
from gpusched_cli.whatif import add_whatif_parser
from gpusched_simulation.placement.cli import add_simulate_parser, run_simulate
from gpusched_simulation.preemption.cli import add_simulate_preemption_parser
from gpusched_simulation.queue.cli import add_simulate_queue_parser
from gpusched_simulation.estimates.cli import add_simulate_estimates_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpusched", description="Multi-tenant GPU cluster scheduler")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_stack_parsers(sub)
    add_job_parsers(sub)
    add_node_parsers(sub)
    add_workload_parsers(sub)
    add_ops_parsers(sub)
    add_agent_parser(sub)
    add_logs_parser(sub)
    add_tenants_parser(sub)
    add_tokens_parser(sub)
    add_producers_parser(sub)
    add_enrolment_parsers(sub)
    add_deadletter_parsers(sub)
    add_chaos_parser(sub)
    add_provision_parsers(sub)
    add_whatif_parser(sub)
    add_simulate_queue_parser(sub)
    add_simulate_estimates_parser(sub)
    add_simulate_preemption_parser(sub)
    add_simulate_parser(sub)
    sub.choices["simulate"].set_defaults(func=run_simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        return 130
    except (ConnectionError, OSError, RuntimeError) as exc:
        print(f"gpusched {args.cmd}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
