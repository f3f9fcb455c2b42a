"""Which of placement's node commands a broker that lost its data needs again (issue 15).

The agents read their commands without an inbox, so the relay cannot tell from the store which ones they
had read; it would publish again every command of the last 15 minutes (1,052 in the chaos campaign), and
every agent reads every command, so the probe's StartJob waited 11 s behind them after a Tansu restart. Most
of them have done their work, and the store says so:

- a StartJob whose run the node acknowledged (its ``placement_starts`` row is gone: the run started, or the
  job moved on), and one the periodic re-send has replaced since;
- a StopJob or PreemptJob of a job that no longer holds GPUs on that node;
- a ReconcileJobs, NodeLost, NodeEnrolled or NodeEnrolmentRefused that a later one of its kind to the same
  node supersedes (what the agent acts on is the latest).

The rest go again, in their order. Anything this cannot read goes again too."""

from __future__ import annotations

import json

import asyncpg

from gpusched_common.topics import NODES_COMMANDS

_LATEST_ONLY = frozenset({"ReconcileJobs", "NodeLost", "NodeEnrolled", "NodeEnrolmentRefused"})


async def commands_done(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> set[int]:
    """The rows (``id``, ``topic``, ``value``) among ``rows`` whose command has done its work."""
    commands: dict[int, tuple[str, dict]] = {}
    for row in rows:
        if row["topic"] != NODES_COMMANDS.name:
            continue
        try:
            envelope = json.loads(bytes(row["value"]))
            kind, payload = envelope["type"], envelope["payload"]
            if isinstance(kind, str) and isinstance(payload, dict) and isinstance(payload.get("node_id"), str):
                commands[row["id"]] = (kind, payload)
        except (ValueError, TypeError, KeyError):
            continue
    done: set[int] = set()
    latest: dict[tuple, int] = {}  # a command superseded by a later one of the same key has done its work
    starts: dict[tuple[str, str, int], int] = {}  # each run's latest StartJob (a re-send replaced the first)
    for row_id in sorted(commands):
        kind, p = commands[row_id]
        if kind == "StartJob":
            key: tuple = (kind, str(p.get("job_id")), p["node_id"], p.get("attempt") or 1)
        elif kind in _LATEST_ONLY:
            key = (kind, p["node_id"])
        else:
            continue
        if key in latest:
            done.add(latest[key])
        latest[key] = row_id
        if kind == "StartJob":
            starts[key[1:]] = row_id
    if starts:
        pending = {(r["job_id"], r["node_id"], r["attempt"]) for r in await conn.fetch(
            "SELECT job_id, node_id, attempt FROM placement_starts WHERE job_id = ANY($1::text[])",
            sorted({job for job, _, _ in starts}))}
        done.update(row_id for run, row_id in starts.items() if run not in pending)
    ends = {row_id: p for row_id, (kind, p) in commands.items() if kind in ("StopJob", "PreemptJob")}
    if ends:
        holding = {(r["job_id"], r["node_id"]) for r in await conn.fetch(
            "SELECT DISTINCT job_id, node_id FROM gpu_allocations WHERE job_id = ANY($1::text[])",
            sorted({str(p.get("job_id")) for p in ends.values()}))}
        done.update(row_id for row_id, p in ends.items() if (p.get("job_id"), p["node_id"]) not in holding)
    return done
