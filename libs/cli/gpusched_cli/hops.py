"""Where a job's time goes between submission and start, hop by hop, read from the event store (issue 16).

Each hop is the time between two marks every job leaves in PostgreSQL: its submission (``jobs.submitted_at``),
the ``recorded_at`` of the events admission, quota and placement wrote for it, the moment its first StartJob
was marked published by placement's relay (the outbox row), the start its agent reported (``started_at`` in
the JobStarted payload, the agent's clock) and the JobStarted placement recorded. Clocks: the agent's is the
only one outside PostgreSQL, so the two hops around it also carry the agent's clock skew (none on one
machine). Used by ``bench-scale`` for its half-load phase.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg

from gpusched_core.whatif.report import percentile

# (name, from, to) over the marks the query reads per job
HOPS = (
    ("submitted -> admitted", "submitted", "admitted"),
    ("admitted -> reserved", "admitted", "reserved"),
    ("reserved -> placed", "reserved", "placed"),
    ("placed -> StartJob published", "placed", "command_published"),
    ("StartJob published -> agent starts it", "command_published", "start_began"),
    ("agent starts it -> started recorded", "start_began", "started"),
)

_MARKS = """
SELECT j.job_id, j.submitted_at AS submitted,
  min(e.recorded_at) FILTER (WHERE e.type = 'JobAdmitted') AS admitted,
  min(e.recorded_at) FILTER (WHERE e.type = 'QuotaReserved') AS reserved,
  min(e.recorded_at) FILTER (WHERE e.type = 'JobPlaced') AS placed,
  min((e.payload ->> 'started_at')::timestamptz) FILTER (WHERE e.type = 'JobStarted') AS start_began,
  min(e.recorded_at) FILTER (WHERE e.type = 'JobStarted') AS started,
  min(c.published) AS command_published
FROM jobs j JOIN events e ON e.stream_id = 'job-' || j.job_id
LEFT JOIN (  -- each job's first StartJob marked published, every StartJob row parsed once
  SELECT convert_from(value, 'UTF8')::jsonb -> 'payload' ->> 'job_id' AS job_id, min(published_at) AS published
  FROM outbox WHERE topic = 'gpusched.nodes.commands' AND headers ->> 'event-type' = 'StartJob' GROUP BY 1
) c ON c.job_id = j.job_id
WHERE j.job_id = ANY($1::text[])
GROUP BY j.job_id, j.submitted_at
"""

_RELAYS = """
SELECT producer, percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY ms) AS q, count(*) AS n FROM (
  SELECT producer, extract(epoch FROM published_at - created_at) * 1000 AS ms FROM outbox
  WHERE published_at IS NOT NULL AND created_at BETWEEN $1 AND $2) t
GROUP BY producer ORDER BY producer
"""


def quantiles(values: list[float]) -> dict[str, float] | None:
    """p50, p90 and p99 (nearest rank, ms rounded to 0.1) and the count; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return {**{f"p{pct}": round(percentile(ordered, pct), 1) for pct in (50, 90, 99)}, "n": len(ordered)}


def hops_of(marks: list[dict], hops: tuple[tuple[str, str, str], ...] = HOPS) -> dict[str, dict[str, float] | None]:
    """Each hop's quantiles (ms) over the jobs that have both of its marks."""
    out: dict[str, dict[str, float] | None] = {}
    for name, start, end in hops:
        values = [(m[end] - m[start]).total_seconds() * 1000 for m in marks
                  if m.get(start) is not None and m.get(end) is not None]
        out[name] = quantiles(values)
    return out


def hop_rows(hops: dict[str, dict[str, float] | None]) -> list[tuple]:
    """Table rows (name, p50, p90, p99) of ``hops_of``'s result (None where a hop had no values)."""
    return [(name, *(q[k] if q else None for k in ("p50", "p90", "p99"))) for name, q in hops.items()]


async def job_hops(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, dict[str, float] | None]:
    """The hops of ``job_ids`` (see the module doc)."""
    rows = await conn.fetch(_MARKS, job_ids)
    return hops_of([dict(row) for row in rows])


# A GPU's turnover: from one run's exit (the agent's clock) to the next run's start on the same GPU (``gap``)
TURNOVER_HOPS = (
    ("exit -> exit recorded", "exited", "exit_recorded"),
    ("exit recorded -> next reserved", "exit_recorded", "reserved"),
    ("next reserved -> placed", "reserved", "placed"),
    ("placed -> StartJob published", "placed", "command_published"),
    ("StartJob published -> agent starts it", "command_published", "start_began"),
)


async def turnover_hops(conn: asyncpg.Connection,
                        gaps: list[tuple[datetime, datetime, str]]) -> dict[str, dict[str, float] | None]:
    """Where a GPU's idle time between two runs went (``turnover_of``), the next runs' marks read from the
    store."""
    rows = await conn.fetch(_MARKS, [job for _, _, job in gaps])
    return turnover_of(gaps, {row["job_id"]: dict(row) for row in rows})


def turnover_of(gaps: list[tuple[datetime, datetime, str]],
                marks: dict[str, dict]) -> dict[str, dict[str, float] | None]:
    """``TURNOVER_HOPS``' quantiles: ``gaps`` are (the previous run's exit by its agent's clock, its end
    recorded, the next run's job id), ``marks`` the next runs' marks by job id. The next job's reservation
    counts from the end recorded where it came before it (a job reserved ahead waits for the GPU, not quota)."""
    out = []
    for exited, recorded, job in gaps:
        mark = marks.get(job)
        if mark is None:
            continue
        reserved = mark.get("reserved")
        out.append({**mark, "exited": exited, "exit_recorded": recorded,
                    "reserved": max(reserved, recorded) if reserved is not None else None})
    return hops_of(out, TURNOVER_HOPS)


STAGES = ("admitted", "reserved", "placed", "command_published", "started")


def stage_progress(marks: list[dict]) -> dict[str, dict[str, float] | None]:
    """For a burst: per stage, the seconds from the first submission until 10, 50, 90 and 100% of the jobs that
    reached it had, and its pace between 10 and 90% (jobs/s): the stage whose pace is lowest holds the rest."""
    firsts = [m["submitted"] for m in marks if m.get("submitted") is not None]
    if not firsts:
        return {}
    t0 = min(firsts)
    out: dict[str, dict[str, float] | None] = {}
    for stage in STAGES:
        at = sorted((m[stage] - t0).total_seconds() for m in marks if m.get(stage) is not None)
        if not at:
            out[stage] = None
            continue
        share = {pct: percentile(at, pct) for pct in (10, 50, 90, 100)}
        spread = share[90] - share[10]
        out[stage] = {**{f"t{pct}_s": round(v, 2) for pct, v in share.items()}, "n": len(at),
                      "per_s": round(0.8 * len(at) / spread, 1) if spread > 0 else None}
    return out


async def burst_stages(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, dict[str, float] | None]:
    """``stage_progress`` of ``job_ids`` (their marks as ``job_hops`` reads them)."""
    return stage_progress([dict(row) for row in await conn.fetch(_MARKS, job_ids)])


async def relay_delays(conn: asyncpg.Connection, job_ids: list[str]) -> dict[str, dict[str, float]]:
    """Per service, how long its outbox rows waited from written to marked published (ms), over the rows written
    while ``job_ids`` went through (from the first's submission to the last's start)."""
    span = await conn.fetchrow("SELECT min(submitted_at) AS a, max(started_at) AS b FROM jobs"
                               " WHERE job_id = ANY($1::text[])", job_ids)
    if span is None or span["a"] is None or span["b"] is None:
        return {}
    rows = await conn.fetch(_RELAYS, span["a"], span["b"])
    return {r["producer"]: {"p50": round(r["q"][0], 1), "p90": round(r["q"][1], 1), "p99": round(r["q"][2], 1),
                            "n": r["n"]} for r in rows}
