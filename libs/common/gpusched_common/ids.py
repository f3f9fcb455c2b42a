"""Identifier types. Ids are plain strings on the wire; NewType keeps them apart in signatures."""

from __future__ import annotations

import re
from typing import NewType

JobId = NewType("JobId", str)
NodeId = NewType("NodeId", str)
TenantId = NewType("TenantId", str)
StreamId = NewType("StreamId", str)

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def is_valid_id(value: str) -> bool:
    """Ids are 1-128 characters of letters, digits and `._:-`, starting with a letter or digit."""
    return bool(_ID_PATTERN.match(value))


def job_stream(job_id: str) -> StreamId:
    return StreamId(f"job-{job_id}")
