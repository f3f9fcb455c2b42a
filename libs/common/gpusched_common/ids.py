"""Identifiers: what a valid id is, and the stream id of a job's events (its SQL twin is the
``job_stream`` function of migration 015)."""

from __future__ import annotations

import hashlib
import re
from typing import NewType

StreamId = NewType("StreamId", str)  # an event stream: one per job, node or tenant

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def is_valid_id(value: str) -> bool:
    """Ids are 1-128 characters of letters, digits and `._:-`, starting with a letter or digit."""
    return bool(_ID_PATTERN.match(value))


def job_stream(job_id: str) -> StreamId:
    return StreamId(f"job-{job_id}")


def job_id_for_request(tenant: str, request_id: str) -> str:
    """A repeated request (same tenant and request id) names the same job."""
    return "j-" + hashlib.sha256(f"{tenant}\0{request_id}".encode()).hexdigest()[:16]
