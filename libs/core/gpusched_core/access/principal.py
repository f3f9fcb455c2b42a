"""Who is asking (pure): the identity every gateway request and credentialed producer is judged by.

A principal comes from a verified credential (an API token, an OIDC JWT, a producer's key), never from a
payload's claims. ``tenant`` is the tenant it is bound to (None: an operator or a viewer, bound to none).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    USER = "user"  # its own tenant's jobs: submit, read its own
    TENANT_ADMIN = "tenant-admin"  # every job of its tenant
    VIEWER = "viewer"  # cluster-wide views, no job details of other tenants
    OPERATOR = "operator"  # everything: tenancy, nodes, tokens


@dataclass(frozen=True)
class Principal:
    subject: str  # who: a token's name and id, a JWT's subject, a producer's name
    role: Role
    tenant: str | None = None  # bound tenant; None only for operators and viewers
