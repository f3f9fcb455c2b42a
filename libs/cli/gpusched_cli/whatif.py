"""`gpusched whatif --since 7d --policy ours,fgd,bestfit [--tenancy new.yaml] [--json]`: the submissions the
event store recorded (GET /v1/jobs, paginated, as the caller's token may see them) replayed with their real
run-times through today's nodes (GET /v1/nodes), in this process (the pure core ``gpusched_core.whatif``; the
gateway's POST /v1/whatif runs the same replay on its side)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpusched import Client
from gpusched_core.durations import parse_duration
from gpusched_core.quota import Tenancy, TenancyError, load_tenancy
from gpusched_core.whatif import replay_jobs, replay_nodes, run_all
from gpusched_simulation.report import stderr_log
from gpusched_simulation.whatif.report import table

from gpusched_cli.job_commands import through_gateway


def add_whatif_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("whatif", help="replay the cluster's recorded submissions under other policies or tenancies")
    p.add_argument("--since", default="7d", help="submissions of this long ago until now (default: 7d)")
    p.add_argument("--policy", default="bestfit,fgd,ours", help="comma list of placement policies")
    p.add_argument("--tenancy", action="append", default=[], type=Path, metavar="FILE",
                   help="a tenancy file to replay under (repeatable; default: no quota)")
    p.add_argument("--tenant", help="only this tenant's submissions (default: all the token may see)")
    p.add_argument("--json", action="store_true", help="the figures as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_whatif)


def history(client: Client, since: datetime, tenant: str | None) -> list[dict]:
    rows, cursor = [], None
    while True:
        page = client.jobs(since=since.isoformat(), tenant=tenant, limit=500, cursor=cursor)
        rows += page["jobs"]
        if not (cursor := page.get("next")):
            return rows


def _tenancies(paths: list[Path]) -> dict[str, Tenancy | None]:
    if not paths:
        return {"": None}
    return {path.name: load_tenancy(path.read_text()) for path in paths}


def cmd_whatif(args: argparse.Namespace) -> int:
    log = stderr_log(args.quiet or args.json)
    try:
        since = datetime.now(UTC) - timedelta(seconds=parse_duration(args.since))
        tenancies = _tenancies(args.tenancy)
    except (ValueError, OSError, TenancyError) as exc:
        print(f"gpusched whatif: {exc}", file=sys.stderr)
        return 2

    def work(client: Client) -> int:
        jobs, skipped = replay_jobs(history(client, since, args.tenant))
        nodes = replay_nodes(client.nodes()["nodes"])
        log(f"{len(jobs)} submissions since {since:%Y-%m-%d %H:%M} ({skipped} left out: never ran or still "
            f"running) on {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs")
        if not nodes:
            print("gpusched whatif: no Ready node to replay on", file=sys.stderr)
            return 1
        try:
            results = run_all(jobs, nodes, [p.strip() for p in args.policy.split(",") if p.strip()], tenancies, log,
                              clock=time.perf_counter)
        except ValueError as exc:
            print(f"gpusched whatif: {exc}", file=sys.stderr)
            return 2
        doc = {"since": since.isoformat(), "jobs": len(jobs), "left_out": skipped,
               "nodes": len(nodes), "gpus": sum(n.gpus for n in nodes), "runs": results}
        print(json.dumps(doc, indent=1) if args.json else table(results))
        return 0

    return through_gateway("whatif", work)
