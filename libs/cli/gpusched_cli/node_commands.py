"""`gpusched nodes | cordon | drain | uncordon`: the cluster's nodes and operators' control of them, through
the gateway (``gpusched.Client``), like the job commands (``gpusched_cli.job_commands``)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from gpusched import Client
from gpusched_cli.job_commands import for_each, output, through_gateway
from gpusched_common.table import render
from gpusched_core.durations import format_duration, parse_duration


def add_node_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("nodes", help="nodes: GPUs, health, allocations, lease")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_nodes)

    for verb, text in (("cordon", "operators: place no new work on nodes (what runs goes on)"),
                       ("drain", "operators: cordon nodes and preempt their jobs to resume elsewhere"),
                       ("uncordon", "operators: place work on nodes again")):
        p = sub.add_parser(verb, help=text)
        p.add_argument("node_ids", nargs="+", metavar="NODE")
        if verb != "uncordon":
            p.add_argument("--reason", help=f"why, recorded with the {verb}")
        if verb == "drain":
            p.add_argument("--grace", default="10m", help="how long each job may checkpoint (default 10m)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func={"cordon": cmd_cordon, "drain": cmd_drain, "uncordon": cmd_uncordon}[verb])


def cmd_nodes(args: argparse.Namespace) -> int:
    def work(client: Client) -> int:
        nodes = client.nodes()["nodes"]
        rows = [(n["node_id"], n.get("state") or n["status"], _free_by_model(n), n["healthy_gpus"], n["jobs"],
                 _lease(n), enforced(n.get("isolation") or {}),
                 "; ".join(n.get("quarantine_reasons") or []) or n.get("cordon_reason") or "")
                for n in nodes]
        output(nodes, args.json, render(["NODE", "STATE", "FREE/TOTAL GPUS", "HEALTHY", "JOBS", "LEASE", "ENFORCED",
                                         "WHY"], rows))
        return 0

    return through_gateway("nodes", work)


def enforced(isolation: dict[str, str]) -> str:
    """Which of a job's limits its node enforces (``cpu,memory,users``; ``--json`` says how, or why not)."""
    if not isinstance(isolation, dict) or not isolation:
        return "unknown"
    names = [name for name in ("cpu", "memory", "devices", "users") if name in isolation
             and not str(isolation[name]).startswith("not enforced")]
    return ",".join(names) or "none"


def _free_by_model(node: dict[str, Any]) -> str:
    """``H100-80GB 3/8``: whole GPUs free (healthy, nothing on them) of the node's total, per model."""
    by_model = node.get("gpus_by_model") or {}
    return ", ".join(f"{model} {c['free']}/{c['total']}" for model, c in sorted(by_model.items())) or "-"


def _lease(node: dict[str, Any]) -> str:
    """``epoch 3, seen 2s ago``."""
    seen = node.get("last_seen_at")
    if seen is None:
        return f"epoch {node.get('lease_epoch')}"
    age = (datetime.now(UTC) - datetime.fromisoformat(seen)).total_seconds()
    return f"epoch {node.get('lease_epoch')}, seen {format_duration(max(0.0, round(age)))} ago"


def cmd_cordon(args: argparse.Namespace) -> int:
    return for_each("cordon", args, lambda client, node_id: client.cordon(node_id, args.reason), "cordon",
                 args.node_ids, "node_id")


def cmd_drain(args: argparse.Namespace) -> int:
    try:
        grace_s = parse_duration(args.grace)
    except ValueError as exc:
        print(f"gpusched drain: --grace: {exc}", file=sys.stderr)
        return 2
    return for_each("drain", args, lambda client, node_id: client.drain(node_id, args.reason, grace_s), "drain",
                 args.node_ids, "node_id")


def cmd_uncordon(args: argparse.Namespace) -> int:
    return for_each("uncordon", args, lambda client, node_id: client.uncordon(node_id), "uncordon", args.node_ids,
                 "node_id")
