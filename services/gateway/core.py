"""The gateway's own decisions (pure): the shape of its error bodies (RFC 9457 problem details), its
opaque pagination cursors, and what of a waiting job a principal may see in the queue. Who may do what is
not decided here but in ``gpusched_core.access``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

PROBLEM_TYPE = "application/problem+json"
# status: (the type's slug, the title); other statuses are "error"
_KINDS = {400: ("invalid-request", "Bad Request"), 401: ("unauthenticated", "Unauthorized"),
          403: ("forbidden", "Forbidden"), 404: ("not-found", "Not Found"),
          405: ("method-not-allowed", "Method Not Allowed"), 413: ("request-too-large", "Content Too Large"),
          422: ("invalid-request", "Unprocessable Content"), 503: ("unavailable", "Service Unavailable"),
          504: ("timeout", "Gateway Timeout")}
QUEUE_ID_FIELDS = ("job_id", "queue", "position")  # all of a waiting job that a role without job reads sees


def problem(status: int, detail: str, title: str | None = None) -> dict[str, Any]:
    """An RFC 9457 body: ``type`` names the kind of problem, ``title`` is the status's phrase unless given,
    ``detail`` says what went wrong for this request (never a credential)."""
    slug, phrase = _KINDS.get(status, ("error", "Error"))
    return {"type": f"urn:gpusched:problem:{slug}", "title": title or phrase,
            "status": status, "detail": detail}


class BadCursor(ValueError):
    """A ``next`` that this gateway did not write."""


def encode_cursor(sort_at: datetime, job_id: str) -> str:
    """Where a page of jobs (newest first by ``(submitted_at, job_id)``) ended, opaque to clients."""
    return json.dumps([sort_at.isoformat(), job_id], separators=(",", ":")).encode().hex()


def decode_cursor(text: str) -> tuple[datetime, str]:
    try:
        sort_at, job_id = json.loads(bytes.fromhex(text))
        parsed = datetime.fromisoformat(sort_at)
    except (ValueError, TypeError) as exc:
        raise BadCursor(f"not a cursor this gateway wrote: {text[:64]!r}") from exc
    if not isinstance(job_id, str) or parsed.tzinfo is None:
        raise BadCursor(f"not a cursor this gateway wrote: {text[:64]!r}")
    return parsed, job_id


def queue_view(entry: dict[str, Any], sees_jobs: bool) -> dict[str, Any]:
    """A waiting job as the principal may see it: everything when it may read those jobs, else only its
    id and where it stands (a viewer reads the queue, but no job: ``gpusched_core.access``)."""
    return dict(entry) if sees_jobs else {k: entry[k] for k in QUEUE_ID_FIELDS}


def borrowed_units(reserved_units: int, nominal_units: int) -> int:
    """What a tenant holds beyond its nominal quota (borrowed from its cohort)."""
    return max(0, reserved_units - nominal_units)
