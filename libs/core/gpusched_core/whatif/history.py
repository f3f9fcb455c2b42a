"""The cluster's own history turned into what the replay takes: each job that ran to an end (rows as
GET /v1/jobs serves them or ``stores.whatif`` reads them: its real run-time is finished - started; its
shape, tenant, priority and submit time) and today's nodes (GET /v1/nodes rows: a node's GPUs by model)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .cluster import ReplayNode
from .engine import ReplayJob


def _at(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def replay_jobs(rows: Iterable[Mapping[str, Any]]) -> tuple[list[ReplayJob], int]:
    """The jobs that ran and ended, and how many rows were left out (never ran, or still running)."""
    jobs, skipped = [], 0
    for row in rows:
        submitted, started, finished = _at(row.get("submitted_at")), _at(row.get("started_at")), _at(row.get("finished_at"))
        if submitted is None or started is None or finished is None or finished < started:
            skipped += 1
            continue
        jobs.append(ReplayJob(row["job_id"], row.get("tenant") or "", max(1, row.get("gpus") or 1),
                              row.get("gpu_model"), row.get("priority") or 0, submitted.timestamp(),
                              max(1.0, (finished - started).total_seconds())))
    return jobs, skipped


def replay_nodes(rows: Iterable[Mapping[str, Any]]) -> list[ReplayNode]:
    """Every registered node that is Ready, one replay node per GPU model it has."""
    out = []
    for row in rows:
        if row.get("status") != "Ready":
            continue
        by_model = row.get("gpus_by_model") or {}
        for model, counts in sorted(by_model.items()):
            node_id = row["node_id"] if len(by_model) == 1 else f"{row['node_id']}/{model}"
            if counts.get("total"):
                out.append(ReplayNode(node_id, model, int(counts["total"])))
    return out
