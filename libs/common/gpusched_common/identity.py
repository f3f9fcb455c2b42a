"""Who a message is from, as the decision cores see it (pure): the result of checking a credential, and the
tenant name an operator's key carries. ``credentials`` checks signatures and produces the ``Verdict``."""

from __future__ import annotations

from dataclasses import dataclass

OPERATOR = "*"  # the tenant of an operator's key: it may act for any tenant and change the tenancy


@dataclass(frozen=True)
class Verdict:
    tenant: str | None  # the authenticated tenant (OPERATOR for an operator key), None when not authenticated
    reason: str | None  # why authentication failed
    subject: str | None = None  # who submitted: the principal a producer attests, the producer, or the key id
    producer: str | None = None  # the producer credential that signed it (None: a key of the tenant keys file)
    # a known, unrevoked credential signed it, though it may not do this (tenant None, a reason): an
    # authorization failure, answered with a rejection; otherwise a failed authentication, only counted
    authenticated: bool = False
