"""The envelope every message travels in, and the base classes of payloads."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Payload(Frozen):
    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1


class Envelope(Frozen):
    event_id: str
    type: str
    schema_version: int
    stream_id: str
    stream_version: int | None = None  # set for event-sourced events, None for commands and reports
    occurred_at: datetime
    producer: str
    tenant: str | None = None
    traceparent: str | None = None
    payload: dict
