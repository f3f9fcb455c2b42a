"""Start-time estimates in the CLI (GET /v1/queue/estimates): ``gpusched queue --start`` adds an "est. start"
column, like ``squeue --start``; ``gpusched job ID`` shows a waiting job's estimate."""

from __future__ import annotations

from typing import Any

from gpusched import ApiError, Client


def relative(estimate: dict[str, Any] | None) -> str:
    """``now``, ``in 12m``, ``in 3h 05m``, ``in 2d 4h``; ``never`` or ``unknown`` when there is no start."""
    if estimate is None:
        return "-"
    wait_s = estimate.get("estimated_wait_s")
    if wait_s is None:
        return "never" if (estimate.get("reason") or "").startswith("never") else "unknown"
    minutes = int(round(wait_s / 60))
    if minutes < 1:
        return "now"
    if minutes < 60:
        return f"in {minutes}m"
    if minutes < 24 * 60:
        return f"in {minutes // 60}h {minutes % 60:02d}m"
    return f"in {minutes // 1440}d {minutes % 1440 // 60}h"


def estimates_by_job(client: Client, tenant: str | None) -> dict[str, dict[str, Any]]:
    """Each waiting job's estimate, by job id."""
    return {e["job_id"]: e for e in client.queue_estimates(tenant)["jobs"]}


def job_estimate(client: Client, job: dict[str, Any]) -> dict[str, Any] | None:
    """The estimate of a waiting job (None: it does not wait, or the caller may not read its queue)."""
    if not job.get("waiting"):
        return None
    try:
        return estimates_by_job(client, job.get("tenant")).get(job["job_id"])
    except ApiError:
        return None


def describe(estimate: dict[str, Any]) -> str:
    """``in 12m (2026-...; run-time: time limit)`` or ``never: ...``."""
    when = relative(estimate)
    if estimate.get("estimated_start") is None:
        return f"{when}: {estimate.get('reason') or ''}".rstrip(": ")
    return f"{when} ({estimate['estimated_start']}; run-time from {estimate.get('runtime_source') or '-'})"
