"""What the checker reads, gathered at the end of a campaign: the runs' own records and the event store."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from gpusched_common.stores.quota import usage_by_flavor

from gpusched_cli.chaos.checker import JobFact, QuotaLimits, QuotaPoint, Run


def read_runs(runs_dir: Path) -> list[Run]:
    runs = []
    for path in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else []:
        try:
            lines = path.read_text().splitlines()
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if not lines or not lines[0].startswith("start "):
            continue
        _, job, attempt, node, pid, started, devices, share = lines[0].split(" ")[:8]
        ended = next((line.split(" ") for line in lines[1:] if line.startswith("end ")), None)
        runs.append(Run(job_id=job, attempt=int(attempt) if attempt.isdigit() else None, node=node, pid=int(pid),
                        start=float(started), alive_until=float(ended[1]) if ended else mtime,
                        exit_code=int(ended[2]) if ended else None,
                        devices=tuple(d for d in devices.split(",") if d and d != "-"),
                        share_milli=int(share) if share.isdigit() else None))
    return runs


async def exercised(database_url: str, job_ids: list[str]) -> dict[str, int]:
    """How much of the system the workload went through: preemptions (for priority, and to return borrowed
    quota), requeues, cancellations, gang runs."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT type, count(*) AS n, count(*) FILTER (WHERE payload->>'reason' LIKE '%borrowed%') AS reclaims"
            " FROM events WHERE stream_id = ANY($1::text[]) AND type = ANY($2::text[]) GROUP BY type",
            [f"job-{j}" for j in job_ids], ["PreemptionRequested", "JobPreempted", "JobRequeued", "JobCancelled",
                                             "GangMemberExited", "JobPlaced"])
    finally:
        await conn.close()
    counts = {r["type"]: r["n"] for r in rows}
    reclaims = sum(r["reclaims"] for r in rows if r["type"] == "PreemptionRequested")
    return {"placements": counts.get("JobPlaced", 0), "preemptions": counts.get("PreemptionRequested", 0) - reclaims,
            "reclaim_preemptions": reclaims, "preempted": counts.get("JobPreempted", 0),
            "requeued": counts.get("JobRequeued", 0), "cancelled": counts.get("JobCancelled", 0),
            "gang_member_exits": counts.get("GangMemberExited", 0)}


@dataclass(frozen=True)
class StoreFacts:
    facts: dict[str, JobFact]
    quota: list[QuotaPoint]
    unpublished: int  # outbox rows never published
    usage_at_end: list[tuple[str, str, int]]  # quota's own table: (tenant, flavor, units still reserved)


async def read_store(database_url: str, job_ids: list[str]) -> StoreFacts:
    """Every job's facts, the quota reservations over time (of every job in the campaign's database, the
    probes' too: a tenant's reservation counts them all), and what is left over at the end."""
    conn = await asyncpg.connect(database_url)
    try:
        statuses = {r["job_id"]: r["status"] for r in await conn.fetch(
            "SELECT job_id, status FROM jobs WHERE job_id = ANY($1::text[])", job_ids)}
        rows = await conn.fetch(
            "SELECT global_position, stream_id, type, payload::text AS payload FROM events"
            " WHERE (stream_id = ANY($1::text[]) AND type = ANY($2::text[])) OR type = ANY($3::text[])"
            " ORDER BY global_position",
            [f"job-{j}" for j in job_ids], ["JobSubmitted", "JobPlaced", "JobSucceeded", "JobFailed"],
            ["QuotaReserved", "QuotaReleased"])
        unpublished = await conn.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL AND parked_at IS NULL")
        usage = [(r["tenant"], r["flavor"], r["reserved_units"]) for r in await usage_by_flavor(conn, None)]
    finally:
        await conn.close()
    facts, points = fold(rows, statuses, job_ids)
    return StoreFacts(facts, points, unpublished, usage)


def quota_limits(tenancy: dict) -> QuotaLimits:
    """Each tenant's most per model (nominal + borrowing limit; with no limit, its cohort's total), from the
    tenancy the campaign put in force."""
    tenants, cohorts, cohort_of = {}, {}, {}
    for cohort in tenancy["tenants"]:
        totals: dict[str, float] = defaultdict(float)
        for child in cohort.get("children", []):
            cohort_of[child["name"]] = cohort["name"]
            for model, quota in child.get("quota", {}).items():
                totals[model] += quota["nominal"]
        for model, total in totals.items():
            cohorts[(cohort["name"], model)] = total
        for child in cohort.get("children", []):
            for model, quota in child.get("quota", {}).items():
                borrowing = quota.get("borrowing_limit")
                tenants[(child["name"], model)] = quota["nominal"] + borrowing if borrowing is not None \
                    else totals[model]
    return QuotaLimits(tenants, cohorts, cohort_of)


def fold(rows, statuses: dict[str, str], job_ids: list[str]) -> tuple[dict[str, JobFact], list[QuotaPoint]]:
    """The facts and quota points of these event rows (global_position, stream_id, type, payload as JSON
    text), in the store's order. A job's end names the node whose report ended it: a gang's failed member,
    not the members stopped because of it."""
    nodes: dict[str, int] = {}
    attempts: dict[str, int] = defaultdict(int)
    last_nodes: dict[str, tuple[str, ...]] = {}
    end_code: dict[str, int | None] = {}
    flavor: dict[str, str] = {}
    points = []
    for row in rows:
        job = row["stream_id"][len("job-"):]
        payload = json.loads(row["payload"])
        if row["type"] == "JobSubmitted":
            nodes[job] = payload.get("spec", {}).get("nodes", 1)
        elif row["type"] == "JobPlaced":
            attempts[job] += 1
            last_nodes[job] = tuple(payload.get("node_ids") or [payload["node_id"]])
        elif row["type"] in ("JobSucceeded", "JobFailed"):
            end_code[job] = payload.get("exit_code")
            if payload.get("node_id"):
                last_nodes[job] = (payload["node_id"],)
        elif row["type"] == "QuotaReserved":
            flavor[job] = payload.get("gpu_model") or ""
            points.append(QuotaPoint(row["global_position"], payload["tenant"], flavor[job],
                                     payload["tenant_reserved_gpus"], job))
        elif row["type"] == "QuotaReleased" and job in flavor:
            points.append(QuotaPoint(row["global_position"], payload["tenant"], flavor[job],
                                     payload["tenant_reserved_gpus"], job))
    facts = {j: JobFact(j, statuses.get(j), nodes.get(j, 1), attempts.get(j, 0), end_code.get(j),
                        last_nodes.get(j, ())) for j in job_ids}
    return facts, points


async def stories(database_url: str, job_ids: list[str], runs: list[Run]) -> dict[str, dict]:
    """What happened to each of ``job_ids`` (the jobs the checker named): its events in the store's order,
    with the fields that say where and why, and every run its records show; kept in chaos.json, so a
    finding can be traced after the campaign's stack is gone."""
    kept = ("node_id", "attempt", "exit_code", "reason", "reason_code", "lease_epoch", "pid", "gpu_indices")
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT stream_id, type, recorded_at, payload FROM events WHERE stream_id = ANY($1)"
                                " ORDER BY global_position", [f"job-{j}" for j in job_ids])
    finally:
        await conn.close()
    out: dict[str, dict] = {j: {"events": [], "runs": []} for j in job_ids}
    for row in rows:
        payload = row["payload"] if isinstance(row["payload"], dict) else json.loads(row["payload"])
        out[row["stream_id"][len("job-"):]]["events"].append(
            {"at": row["recorded_at"].timestamp(), "type": row["type"],
             **{k: payload[k] for k in kept if payload.get(k) is not None}})
    for run in sorted(runs, key=lambda r: r.start):
        if run.job_id in out:
            out[run.job_id]["runs"].append({"attempt": run.attempt, "node": run.node, "pid": run.pid,
                                            "start": run.start, "alive_until": run.alive_until,
                                            "exit_code": run.exit_code})
    return out
