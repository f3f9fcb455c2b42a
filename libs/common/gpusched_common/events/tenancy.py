"""Run-time tenancy changes: an operator publishes a revision of the tenancy file as an event."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from gpusched_common.events.base import Payload


class TenancyUpdated(Payload):
    """A new revision of the tenancy file (``deploy/tenants.example.yaml``), as its YAML ``document``.

    Signed like a submission, with an operator credential (a key whose tenant is ``*``), in the message
    headers. The quota service validates it, keeps it when its ``revision`` is newer than the one in force,
    and enforces it from then on; anything else is rejected with its reasons (``quota_tenancy_rejections``).
    """

    TYPE: ClassVar[str] = "TenancyUpdated"
    revision: int  # must equal the document's own `revision`
    document: str
    published_at: datetime
    source: str | None = None  # where it came from, for people (e.g. the file name)
