"""Settings from the environment (prefix GPUSCHED_). Built by each process's `app`, never at import."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUSCHED_", extra="ignore")

    database_url: str = "postgresql://postgres@127.0.0.1:5432/gpusched"
    kafka_bootstrap: str = "127.0.0.1:9092"
    # Apache Kafka supports the idempotent producer; the local Tansu broker does not.
    kafka_idempotence: bool = False
    kafka_partitions: int = 6
    kafka_max_request_bytes: int = 2 * 1024 * 1024
    # Brokers hold a group join open for a while waiting for more members (Tansu: about half the session
    # timeout), so local stacks and tests use a short session; Apache Kafka needs >= 6000.
    kafka_session_timeout_ms: int = 10_000
    # How every Kafka client of this process authenticates (gpusched_common/kafka_client.py): PLAINTEXT on a
    # loopback broker; SASL_SSL with SCRAM on a shared one. The password comes from the environment or,
    # better, a file only this process can read; the CA file verifies the broker's certificate.
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = "SCRAM-SHA-512"
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_sasl_password_file: Path | None = None
    kafka_ssl_cafile: Path | None = None

    trace_exporter: Literal["none", "console", "file", "otlp"] = "none"
    trace_file: Path | None = None
    otlp_endpoint: str | None = None
    log_level: str = "INFO"

    # retries for a message whose handler fails for a reason other than an unreachable dependency
    handler_max_attempts: int = 3
    consumer_batch_max: int = 200  # messages applied in one database transaction
    consumer_batch_wait_ms: int = 5  # how long a fetch may wait to fill a batch
    handler_retry_backoff_s: float = 0.2
    outbox_poll_interval_s: float = 0.05
    reconcile_interval_s: float = 5.0

    # tenant credentials (HMAC keys); unset: authentication is off (development only, logged loudly)
    tenant_keys_file: Path | None = None
    admission_rate_per_s: float = 500.0  # per tenant
    admission_rate_burst: float = 5000.0

    # the tenancy tree (deploy/tenants.example.yaml): put in force at start when newer than the revision in
    # PostgreSQL (operators publish later ones with `gpusched tenants apply`); required on a fresh database
    tenants_file: Path | None = None
    quota_reclaim_cooldown_s: float = 300.0  # a reclaim of borrowed quota still needed is asked again after this

    # preemption: the victims' checkpoint grace, how long a (re)started run is protected, and whether a
    # higher-priority job may preempt another tenant's work always ("any") or only borrowed capacity
    preemption_grace_s: float = 30.0
    preemption_min_runtime_s: float = 60.0
    preemption_cross_tenant: Literal["any", "borrowing-only"] = "any"
    # GPUs held for a preemptor go back to everyone when it has not been placed on them this long (a job
    # still waiting for quota, say); its victims have stopped long before (preemption_grace_s)
    nomination_ttl_s: float = 300.0

    placement_policy: str = "bestfit"  # any name from `gpusched simulate --list-policies`

    node_id: str = "node-1"
    nvml_backend: Literal["simulated", "real"] = "simulated"
    simulated_gpus: str = "H100-80GB:8"
    agent_work_dir: Path = Path(".gpusched/agents")
    telemetry_interval_s: float = 5.0
    heartbeat_interval_s: float = 10.0
    # node agent: labels (`rack=r1,gpusched.io/pool=train`), lease, health and fault injection
    node_labels: str = ""
    lease_ttl_s: float = 30.0
    fence_grace_s: float = 10.0  # SIGTERM -> SIGKILL grace when the agent stops jobs
    health_interval_s: float = 2.0
    gpu_fault_policy: Literal["stop", "keep"] = "stop"
    health_ignored_xids: str = "13,31,43,45,68,109"  # application errors, not GPU faults
    mps_pipe_dir: Path | None = None  # CUDA MPS control pipe; shares are enforced only when it exists
    simulated_faults: str = ""  # e.g. `xid:3:79@30s,ecc:1@60s,thermal:2@10s`; see node_agent/faults.py
    simulated_nodes: int = 1  # >1: one process runs node_id-1..N as a fleet of simulated agents

    metrics_log_interval_s: float = 10.0
    metrics_port: int | None = None  # Prometheus scrape endpoint (/metrics); None: no endpoint
    metrics_host: str = "127.0.0.1"
    metrics_pool_label: str = "gpusched.io/pool"
    metrics_idle_threshold_pct: float = 5.0
    metrics_idle_after_s: float = 300.0  # allocated GPUs idle longer than this are reported with their jobs
    scale_out_window_s: float = 60.0
    scale_out_clear_s: float = 15.0
    scale_out_cooldown_s: float = 300.0
    scale_out_max_nodes: int = 16
    scale_in_idle_s: float = 600.0
    scale_in_cooldown_s: float = 300.0
    scale_min_nodes_per_model: int = 0
    scale_provision_timeout_s: float = 900.0
