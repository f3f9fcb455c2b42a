"""The gateway's settings (environment prefix GPUSCHED_), on top of what every process shares."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpusched_common.settings import FairShareSettings


class GatewaySettings(FairShareSettings):  # POST /v1/jobs:check judges with quota's fair backfill
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
    # the dashboard's OIDC sign-in (authorization code + PKCE): the client registered with the issuer; a
    # secret file for a confidential client; the callback URL where a proxy changes it
    oidc_client_id: str | None = None
    oidc_client_secret_file: Path | None = None
    oidc_redirect_url: str | None = None
    oidc_scopes: str = "openid profile email"
    # the gateway's producer key (gpusched producers create --attests, or gpusched gateway-init): without
    # one it serves reads and answers submissions with 503
    gateway_producer_key_file: Path | None = None
    gateway_publish_timeout_s: float = Field(5.0, gt=0)  # a submission the broker has not acked by then: 503
    gateway_max_batch: int = Field(1000, ge=1, le=10_000)  # jobs in one POST /v1/jobs:batch
    # per principal: submissions (a batch costs one per job) and reads, each a token bucket
    gateway_submit_rate_per_s: float = Field(1000.0, gt=0)
    gateway_submit_burst: float = Field(20_000.0, ge=1)
    gateway_read_rate_per_s: float = Field(100.0, gt=0)
    gateway_read_burst: float = Field(500.0, ge=1)
    gateway_follow_poll_s: float = Field(0.2, gt=0)  # how often a followed job's stream is read again
    gateway_follow_wait_s: float = Field(5.0, ge=0)  # a followed job not yet recorded: wait this long for it
    gateway_follow_max_s: float = Field(3600.0, gt=0)  # a follow ends after this (the client reconnects)
    # the dashboard (/ui): how long a signed-in browser's session cookie lives (the token's own expiry still
    # applies); Secure cookies also over plain HTTP (behind a TLS-terminating proxy); sign-in attempts per
    # client address
    gateway_session_max_age_s: int = Field(12 * 3600, ge=60)
    gateway_cookie_secure: bool = False
    gateway_signin_rate_per_s: float = Field(1.0, gt=0)
    gateway_signin_burst: float = Field(20.0, ge=1)
    # GET /v1/stream: how often the one change feed per process reads the event store while anyone listens,
    # and at most how often a listener is told that the cluster changed
    gateway_stream_poll_s: float = Field(0.25, gt=0)
    gateway_stream_cluster_every_s: float = Field(2.0, ge=0)
    # POST /v1/jobs:check judges as the services that decide: the same variables as placement's policy and
    # preemption's protection and cross-tenant rule (their settings; the defaults are theirs)
    placement_policy: str = "ours"
    preemption_min_runtime_s: float = 60.0
    preemption_cross_tenant: Literal["any", "borrowing-only"] = "any"
    # POST /v1/whatif: at most this many jobs in the window; a replay past the timeout is given up (504); at
    # most this many replays at once in one process (others 503); victims' grace as the preemption service's
    gateway_whatif_max_jobs: int = Field(50_000, ge=1)
    gateway_whatif_timeout_s: float = Field(60.0, gt=0)
    gateway_whatif_concurrency: int = Field(1, ge=1)
    preemption_grace_s: float = 30.0
