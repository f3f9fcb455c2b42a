"""Settings from the environment (prefix GPUSCHED_). Built by each process's `app`, never at import.

``Settings`` holds what every process shares (database, broker, tracing, consumers); each service adds
its own fields in its ``settings`` module (``services/<service>/settings.py``), a subclass of this one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpusched_common.topics import NODE_COMMAND_PARTITIONS


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUSCHED_", extra="ignore")

    database_url: str = "postgresql://postgres@127.0.0.1:5432/gpusched"
    kafka_bootstrap: str = "127.0.0.1:9092"
    # Apache Kafka supports the idempotent producer; the local Tansu broker does not.
    kafka_idempotence: bool = False
    kafka_partitions: int = 6
    # the node command topic's own partition count for `create-topics` (topics.NODE_COMMAND_PARTITIONS says why)
    node_command_partitions: int = NODE_COMMAND_PARTITIONS
    kafka_max_request_bytes: int = 2 * 1024 * 1024
    # the most a consumer's fetch brings back of each partition, and of all of them at once (Tansu reads the
    # latter per partition too); a larger first record batch still comes whole, on Apache Kafka as on Tansu.
    # aiokafka buffers a fetch per partition, so what a lagging consumer holds is bounded by partitions x this,
    # not by its lag: with aiokafka's 50 MiB and the 2 MiB per partition it had, quota held 10-25 MiB of
    # fetched and decoded records while it took in a backlog of 10,000 jobs
    kafka_fetch_max_bytes: int = 256 * 1024
    # how long a consumer's fetch may wait at the broker for data. Apache Kafka answers as soon as a record
    # arrives, so the wait costs no latency there (aiokafka's 500 ms). Tansu answers a waiting fetch only when
    # it runs out (measured: a 202 ms round trip with 500, 2 ms with 50): the local stack on Tansu sets 50
    # (`gpusched up`), every hop's latency bound, at the price of idle fetches
    kafka_fetch_max_wait_ms: int = 500
    # the same for consumers of the topics that carry little and nothing waited for by the millisecond
    # (topics.Topic.background: cancels, tenancy revisions, reclaims): on Tansu each consumer polling every
    # 50 ms cost the stack about 0.02 cores idle (1,000 nodes: all of them at 500 ms idled at 1.05 cores
    # instead of 1.44); a cancel there waits up to this long for its fetch. Never below the setting above
    kafka_fetch_max_wait_background_ms: int = 500
    # how long a consumer leaves the records its handler has not taken yet before it fetches the broker's
    # other partitions without theirs (messaging.PromptConsumer; aiokafka's own is 100 ms). Apache Kafka holds
    # a fetch that left a partition out for its whole wait when a record comes for that partition, so the
    # next fetch waits for the handler. Tansu answers a waiting fetch late whatever comes (the local stack: 50 ms):
    # there `gpusched up` keeps aiokafka's 100 ms, which fetches ahead while a handler runs
    kafka_untaken_hold_ms: int = 60_000
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
    # the relay is woken by each commit that wrote outbox rows (LISTEN/NOTIFY); this poll only covers a
    # notification lost with a broken connection
    outbox_poll_interval_s: float = 1.0
    # retention (issue 15): published outbox rows and inbox claims are deleted after these; the event store
    # is kept. Keep the inbox at least as long as the topics' retention (Kafka's default: 7 days), so a
    # message redelivered from an old offset is still known
    outbox_retention_s: float = 86_400.0
    inbox_retention_s: float = 7 * 86_400.0
    retention_interval_s: float = 600.0
    # after the broker lost its data (an offset acknowledged below one acknowledged before), each relay
    # publishes again what it published within this long (the node commands' signature window)
    outbox_republish_s: float = 900.0

    # how often node agents sample GPUs; the metrics service holds a GPU silent for 3 intervals stale
    telemetry_interval_s: float = 5.0

    # the operator's GPU catalogue (YAML: aliases and display names of GPU models; gpusched_core.gpu_models),
    # read by the doors that check a job's GPU model; unset: models are named by the normaliser's rule alone
    gpu_catalogue: Path | None = None

    # tenant credentials (HMAC keys; the CLI signs with them, admission and quota verify with them); unset:
    # authentication is off (development only, logged loudly)
    tenant_keys_file: Path | None = None
    # the key this service signs what it sends with (placement's and preemption's node commands are run
    # only when signed: gpusched_common.signing); a file of mode 0600, `gsk_<id>_<secret>`
    service_key_file: Path | None = None
    service_keys_dir: Path | None = None  # or a directory of keys, `<service>.key` each (the local stack)
    # node reports and telemetry are believed only when signed by the enrolled key of the node they name
    # (gpusched_common.node_keys); true: unsigned ones are believed too (development only: then anyone who
    # can write to the broker speaks for any node). A signed message is verified either way.
    accept_unsigned_node_reports: bool = False

    @classmethod
    def of(cls, shared: Settings, **fields: object) -> Self:
        """These settings for a process given the shared ones (a test's, a stack's): ``shared`` itself when
        it is of this class already and nothing is overridden, else its shared fields with ``fields``, the
        rest from the environment and this class's defaults."""
        if isinstance(shared, cls) and not fields:
            return shared
        unknown = set(fields) - set(cls.model_fields)
        if unknown:
            raise TypeError(f"{cls.__name__} has no setting(s) {', '.join(sorted(unknown))}")
        return cls(**{**shared.model_dump(exclude_unset=True), **fields})


class FairShareSettings(Settings):
    """Fair share beyond the queue's order, one margin for both rules (``gpusched_core.quota.fairness``): a
    job that holds quota and waits for room on the nodes may take runs (older than the quantum) of tenants
    of its cohort whose fair share is above what its tenant's becomes by more than the margin (fair-share
    preemption, the preemption service); and while it waits, no other tenant of its cohort gets quota for a
    job (of that GPU model, at most its priority) that takes it past that share (fair backfill, the quota
    service; the gateway's ``jobs:check`` judges with it too)."""

    fair_share_margin: float = Field(default=0.5, ge=0.0)
    fair_backfill: bool = True  # off: every job that fits quota is reserved, whoever waits for room
    fair_share_preemption: bool = True  # off: only priority and reclaims of borrowed quota preempt
    fair_share_quantum_s: float = Field(default=600.0, ge=0.0)  # runs younger lose nothing to fair share

    @property
    def backfill_margin(self) -> float | None:
        """The margin quota's cycle is given (None: fair backfill off)."""
        return self.fair_share_margin if self.fair_backfill else None

    @property
    def preemption_margin(self) -> float | None:
        """The margin the preemption service weighs with (None: no fair-share preemption)."""
        return self.fair_share_margin if self.fair_share_preemption else None
