"""`gpusched bench-growth` (`make bench-growth`): how the cost of a job grows with the cluster and the queue
(issue 16, part 4).

One cell per ``--nodes`` x ``--pending``, each on a fresh stack of its own (simulated nodes x 8 H100 in fleets,
every service its own process, as in ``bench_scale``):

1. **The backlog**: ``pending`` one-GPU jobs of a tenant ``backlog``. Where it waits (``--backlog-waits``):
   - ``quota`` (the default): the tenant has one GPU of quota and may not borrow, in the same cohort as the
     other teams. One runs; the rest wait on quota, in the cohort's queue that every reservation cycle reads,
     as a real backlog does. The cell waits until quota has judged every one.
   - ``placement``: the tenant is a cohort of its own with quota for every job, and each job asks for more
     host CPU than a simulated node has (``BACKLOG_CPU_MILLI``): quota reserves them all and they wait in
     placement's queue, which every placement cycle reads, deferred with their reasons as a job waiting for
     room is. The cell waits until placement has deferred every one.
2. **The probe**: the scale benchmark's burst (``bench_scale.burst``) of ``--probe-jobs`` jobs of mixed shapes
   from the other teams, the same in every cell and small enough to fit the smallest cluster, measured after
   the idle cluster (backlog included) was: placed jobs/s, submit -> placed p50, CPU milliseconds per placed
   job summed over the services and net of the idle cluster, per service too.

Beside them: how fast the backlog went in, the idle cluster's cores with the backlog waiting, and every
service's memory per waiting job (and, from one cell to the next of as many nodes with the backlog waiting
in the same place, per job added: what a backlog costs once, a batch's working set and the fetched records,
left out). ``cpu_growth`` divides a cell's CPU per placed job by the first cell's. Tables, and
``bench-results/growth.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
import yaml

from gpusched_common import events as ev
from gpusched_common.stores.quota import judged_jobs
from gpusched_common.table import render

from gpusched_cli import stack
from gpusched_cli.bench_scale import RUN, add_stack_arguments, burst, counts, per_service, stack_pids, up_for, usage
from gpusched_cli.workload import submit_through_gateway

BACKLOG = "backlog"
WAITS = ("quota", "placement")
# more host CPU than a simulated node has (8 GPUs x 16 cores, ``services/node_agent/simulated.py``): a backlog
# job that waits on placement fits no node, and every cycle weighs it again
BACKLOG_CPU_MILLI = 256_000
# memory per job added is judged against the goal of issue 16: at most 1 KB per pending job in each service
KIB_GOAL = 1.0
# the services a waiting job can cost memory in (the agents and the broker hold none of it per job)
SERVICES = ("gateway", "admission", "quota", "placement", "preemption", "metrics")
COLUMNS = ("nodes", "pending", "backlog_waits", "backlog_judged", "backlog_per_s", "placed", "placed_per_s", "submit_to_placed_p50_ms",
           "cpu_ms_per_job_total", "quota_cpu_ms_per_job", "placement_cpu_ms_per_job", "idle_cores_total",
           "quota_kib_per_pending_job", "quota_kib_per_added_job", "cpu_growth")
# the backlog is one tenant's: the submission and admission rate limits would turn most of it away
UNLIMITED = {"GPUSCHED_ADMISSION_RATE_PER_S": "1000000", "GPUSCHED_ADMISSION_RATE_BURST": "1000000",
             "GPUSCHED_GATEWAY_SUBMIT_RATE_PER_S": "1000000", "GPUSCHED_GATEWAY_SUBMIT_BURST": "1000000"}


def add_growth_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", default="100,1000,5000", help="simulated node counts, comma-separated")
    p.add_argument("--pending", default="1000,10000,50000", help="backlog sizes (waiting jobs), comma-separated")
    p.add_argument("--probe-jobs", type=int, default=300,
                   help="jobs of the measured burst in every cell (they must fit the smallest cluster)")
    p.add_argument("--settle-s", type=float, default=15.0, help="a probe ends when no job started for this long")
    p.add_argument("--nodes-per-fleet", type=int, default=250, help="simulated nodes per agent process")
    p.add_argument("--backlog-waits", choices=WAITS, default="quota",
                   help="where the backlog waits: on quota (one GPU of quota) or in placement's queue (quota for"
                        " all, room on no node)")
    p.add_argument("--timeout", type=float, default=900.0, help="give up on a phase of a cell after this many seconds")
    add_stack_arguments(p, "bench-results/growth.json")


class BacklogTooSlow(RuntimeError):
    """Quota did not judge the whole backlog in time (the cell reports it and has no probe)."""


def parse_counts(text: str) -> list[int]:
    """``"100,1000"`` -> [100, 1000]; a clear error for anything but positive whole numbers."""
    try:
        counts_ = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not counts_ or any(c <= 0 for c in counts_):
        raise argparse.ArgumentTypeError(f"expected positive counts, got {text!r}")
    return counts_


def growth_tenancy(nodes: int, waits: str = "quota", pending: int = 0) -> dict:
    """The local stack's tenancy for ``nodes`` x 8 H100 and the tenant ``backlog``. Waiting on quota: in the
    teams' cohort with one GPU of quota and no borrowing, so all but one of its jobs wait on quota. Waiting in
    placement: a cohort of its own with a GPU of quota for each of its ``pending`` jobs (nobody borrows it)."""
    tenancy = stack.local_tenancy([("fleet", f"H100-80GB:{nodes * 8}")])
    if waits == "placement":
        tenancy["tenants"].append({"name": BACKLOG, "quota": {"H100-80GB": {"nominal": float(max(pending, 1))}}})
    else:
        tenancy["tenants"][0]["children"].append(
            {"name": BACKLOG, "quota": {"H100-80GB": {"nominal": 1.0, "borrowing_limit": 0.0}}})
    return tenancy


def backlog_specs(count: int, waits: str = "quota") -> list[ev.JobSpec]:
    cpu = BACKLOG_CPU_MILLI if waits == "placement" else 0
    return [ev.JobSpec(tenant=BACKLOG, command=RUN, name=f"backlog-{i}", gpus=1, cpu_milli=cpu) for i in range(count)]


async def deferred_by_placement(conn: asyncpg.Connection, tenant: str) -> int:
    """The tenant's jobs placement has weighed and deferred with reasons (each waits in its queue)."""
    return await conn.fetchval("SELECT count(DISTINCT stream_id) FROM events WHERE type = $1 AND tenant = $2",
                               ev.PlacementDeferred.TYPE, tenant)


def cell_row(nodes: int, pending: int, backlog: dict, probe: dict, waits: str = "quota") -> dict:
    """One cell's figures, as the table and the JSON show them."""
    per_job = probe["cpu_ms_per_job"]
    return {
        "nodes": nodes, "pending": pending, "backlog_waits": waits, **backlog,
        "placed": probe["placed"], "placed_per_s": probe["placed_per_s"],
        "submit_to_placed_p50_ms": probe["submit_to_placed_p50_ms"],
        "submit_to_placed_p99_ms": probe["submit_to_placed_p99_ms"],
        "cpu_ms_per_job_total": probe["cpu_ms_per_job_total"], "cpu_ms_per_job": per_job,
        "quota_cpu_ms_per_job": per_job.get("quota"), "placement_cpu_ms_per_job": per_job.get("placement"),
        "idle_cores_total": probe["idle_cores_total"], "idle_cores": probe["idle_cores"], "rss_mib": probe["rss_mib"],
    }


def with_growth(rows: list[dict]) -> list[dict]:
    """Each row with ``cpu_growth``: its CPU per placed job over the first row's (None where either is unknown);
    and ``kib_per_added_job``: how much more memory each service took for each job more waiting than in the
    row before it with as many nodes, the backlog waiting in the same place and a smaller backlog (empty for
    the first such; ``quota_kib_per_added_job`` is quota's). Memory per waiting job also carries what any
    backlog costs once (the working set of a batch, the fetched records); this is what each further job costs."""
    base = rows[0].get("cpu_ms_per_job_total") if rows else None
    out = []
    for i, row in enumerate(rows):
        waits = row.get("backlog_waits", "quota")
        smaller = [r for r in rows[:i] if r["nodes"] == row["nodes"] and r["pending"] < row["pending"]
                   and r.get("backlog_waits", "quota") == waits and r.get("backlog_mib")]
        added: dict[str, float] = {}
        if smaller and row.get("backlog_mib"):
            last = max(smaller, key=lambda r: r["pending"])
            jobs = row["pending"] - last["pending"]
            added = {name: round(1024 * (mib - last["backlog_mib"][name]) / jobs, 2)
                     for name, mib in row["backlog_mib"].items() if name in last["backlog_mib"]}
        out.append({**row, "cpu_growth": round(row["cpu_ms_per_job_total"] / base, 2)
                    if base and row.get("cpu_ms_per_job_total") is not None else None,
                    "kib_per_added_job": added, "quota_kib_per_added_job": added.get("quota")})
    return out


def memory_rows(rows: list[dict]) -> list[tuple]:
    """Per cell with an added-job figure: each service's KiB per job added and whether it is within the goal."""
    out = []
    for row in rows:
        added = row.get("kib_per_added_job") or {}
        if not added:
            continue
        cells = [added.get(name) for name in SERVICES]
        worst = max((v for v in cells if v is not None), default=None)
        verdict = "-" if worst is None else ("yes" if worst <= KIB_GOAL else "no")
        out.append((row["nodes"], row["pending"], row.get("backlog_waits", "quota"), *cells, verdict))
    return out


async def fill_backlog(state: stack.StackState, pending: int, timeout_s: float,
                       progress: Callable[[str], None], waits: str = "quota") -> dict:
    """Submit the backlog and wait until the service it waits on judged all of it (quota; or placement, which
    defers it); its rate and each service's memory per waiting job. A backlog not judged within ``timeout_s``
    raises ``BacklogTooSlow``: a probe beside it would measure the backlog still going in, not the cost of a
    job with that many waiting."""
    pids = stack_pids(state)
    before, started = per_service({n: u.rss_mib for n, u in usage(pids).items()}, max), time.monotonic()
    await asyncio.to_thread(submit_through_gateway, state, backlog_specs(pending, waits))
    judge = deferred_by_placement if waits == "placement" else judged_jobs
    conn = await asyncpg.connect(state.database_url)
    try:
        while (judged := await judge(conn, BACKLOG)) < pending:
            if time.monotonic() - started > timeout_s:
                raise BacklogTooSlow(f"{waits} judged {judged} of {pending} backlog jobs within {timeout_s:g}s")
            progress(f"  [{time.monotonic() - started:6.1f}s] backlog: recorded {(await counts(conn, tenants=[BACKLOG]))[0]},"
                     f" judged by {waits} {judged} of {pending}")
            await asyncio.sleep(2.0)
    finally:
        await conn.close()
    took = time.monotonic() - started
    after = per_service({n: u.rss_mib for n, u in usage(pids).items()}, max)
    grown = {name: round(after[name] - before[name], 2) for name in SERVICES if name in after and name in before}
    return {"backlog_judged": judged, "backlog_s": round(took, 1), "backlog_per_s": round(judged / took, 1),
            "backlog_mib": grown, "kib_per_pending_job": {n: round(1024 * m / max(judged, 1), 2) for n, m in grown.items()},
            "quota_backlog_mib": grown.get("quota"),
            "quota_kib_per_pending_job": round(1024 * grown["quota"] / max(judged, 1), 2) if "quota" in grown else None}


async def measure_cell(args: argparse.Namespace, nodes: int, pending: int, progress: Callable[[str], None]) -> dict:
    cell = argparse.Namespace(nodes=nodes, jobs=args.probe_jobs, settle_s=args.settle_s, idle_s=args.idle_s,
                              fleet_processes=max(1, -(-nodes // args.nodes_per_fleet)), telemetry_s=args.telemetry_s,
                              health_s=args.health_s, timeout=args.timeout, broker=args.broker, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="gpusched-growth-") as tmp:
        tenants = Path(tmp) / "tenants.yaml"
        tenants.write_text(yaml.safe_dump(growth_tenancy(nodes, args.backlog_waits, pending), sort_keys=False))
        state = await up_for(cell, progress, {"GPUSCHED_TENANTS_FILE": str(tenants), **UNLIMITED})
        try:
            backlog = await fill_backlog(state, pending, args.timeout, progress, args.backlog_waits)
            progress(f"  backlog in: {backlog['backlog_per_s']} jobs/s; the probe: {args.probe_jobs} jobs")
            return cell_row(nodes, pending, backlog, await burst(cell, state, progress), args.backlog_waits)
        finally:
            stack.down(progress=lambda line: None)


async def run_growth(args: argparse.Namespace, progress: Callable[[str], None] = print,
                     done: Callable[[list[dict]], None] = lambda rows: None) -> list[dict]:
    """Every cell in turn; ``done`` gets the rows so far after each (a long run keeps what it measured)."""
    rows: list[dict] = []
    cells = [(n, p) for n in parse_counts(args.nodes) for p in parse_counts(args.pending)]
    for i, (nodes, pending) in enumerate(cells, 1):
        progress(f"cell {i}/{len(cells)}: {pending} waiting jobs, {nodes} nodes x 8 GPUs")
        try:
            rows.append(await measure_cell(args, nodes, pending, progress))
        except Exception as exc:  # noqa: BLE001 - a cell that fails (a stack that did not come up) is reported, the rest run
            progress(f"  cell failed: {type(exc).__name__}: {exc}")
            rows.append({"nodes": nodes, "pending": pending, "backlog_waits": args.backlog_waits,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
        done(with_growth(rows))
    return with_growth(rows)


def cmd_growth(args: argparse.Namespace) -> int:
    if stack.load() is not None:
        print("gpusched bench-growth: a stack is up; it starts its own (run `gpusched down` first)")
        return 1
    try:
        parse_counts(args.nodes), parse_counts(args.pending)
    except argparse.ArgumentTypeError as exc:
        print(f"gpusched bench-growth: {exc}")
        return 2
    os.environ.setdefault("GPUSCHED_KAFKA_SESSION_TIMEOUT_MS", "10000")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def write(rows: list[dict]) -> None:
        out.write_text(json.dumps({"probe_jobs": args.probe_jobs, "backlog_waits": args.backlog_waits, "cells": rows},
                                  indent=2) + "\n")

    rows = asyncio.run(run_growth(args, progress=lambda line: print(line, flush=True), done=write))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("\n" + render([c.upper() for c in COLUMNS], [tuple(row.get(c) for c in COLUMNS) for row in rows]))
        memory = memory_rows(rows)
        if memory:
            print(f"\nKiB of memory per waiting job added, by service (goal: at most {KIB_GOAL:g} KiB in each)")
            print(render(["NODES", "PENDING", "WAITS ON", *(s.upper() for s in SERVICES), "ALL WITHIN"], memory))
    print(f"\nwritten to {out}")
    return 0
