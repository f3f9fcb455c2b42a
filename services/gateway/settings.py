"""The gateway's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from pydantic import Field

from gpusched_common.settings import Settings


class GatewaySettings(Settings):
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(0, ge=0, le=65535)  # 0: a free port, chosen by the operating system
    gateway_max_body_bytes: int = Field(1024 * 1024, gt=0)  # larger requests are refused with 413
    gateway_read_timeout_s: float = Field(10.0, gt=0)  # a request still unanswered after this gets 504
    gateway_pool_max_size: int = Field(10, ge=1)
    # the gateway's own database role (migration 017: SELECT on the read models it serves); None: the
    # shared database_url (development only: that is the stack's superuser)
    gateway_database_url: str | None = None
    # OIDC: where both are set, bearer JWTs from this issuer are verified against its JWKS
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks_url: str | None = None  # None: from the issuer's /.well-known/openid-configuration
    oidc_subject_claim: str = "sub"
    oidc_tenant_claim: str = "gpusched_tenant"
    oidc_role_claim: str = "gpusched_role"
