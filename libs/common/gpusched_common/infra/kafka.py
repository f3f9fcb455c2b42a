"""Apache Kafka, the production broker, run from Maven Central's jars on the machine's Java.

`kafka_classpath()` resolves `deploy/kafka/pom.xml` with the machine's Maven (jars land in ~/.m2, Maven
checks their published checksums with --strict-checksums) and then checks every jar's SHA-256 against
`deploy/kafka/kafka-<version>.sha256`, so a changed artifact is refused, not run. `start_kafka()` formats
a KRaft storage directory (a cached, pre-formatted template is copied: formatting starts a JVM) and runs
one combined broker+controller on free loopback ports with a small heap. Data lives in its directory, so
a restarted broker keeps every topic, record and committed offset.

`python -m gpusched_common.infra.kafka fetch` resolves and checks the jars (what `make kafka` runs);
`... lock` rewrites the checksum file after a version bump (review its diff).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from gpusched_common.infra.processes import alive, free_port, spawn, stop_pid, wait_for_port

KAFKA_VERSION = "4.1.1"
DEPLOY_DIR = Path(__file__).resolve().parents[4] / "deploy" / "kafka"
POM = DEPLOY_DIR / "pom.xml"
STARTED_LINE = "Kafka Server started"
_LOG4J = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


class KafkaUnavailable(RuntimeError):
    """Java, Maven or a verified set of Kafka jars is missing."""


def cache_dir() -> Path:
    path = Path(os.environ.get("GPUSCHED_CACHE_DIR", Path.home() / ".cache" / "gpusched"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def lock_file(version: str = KAFKA_VERSION) -> Path:
    return DEPLOY_DIR / f"kafka-{version}.sha256"


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    found = str(candidate) if candidate and candidate.exists() else shutil.which("java")
    if not found:
        raise KafkaUnavailable("Apache Kafka needs Java 17 or newer: install a JDK or set JAVA_HOME")
    return found


def _resolve(version: str) -> list[Path]:
    """Every runtime jar of the broker, resolved by Maven (downloading into ~/.m2 when missing)."""
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaUnavailable("fetching Apache Kafka needs Maven (`mvn`) on PATH")
    out = cache_dir() / f"kafka-{version}.classpath.tmp"
    result = subprocess.run(
        [mvn, "-B", "-q", "--strict-checksums", "-f", str(POM), "dependency:build-classpath",
         f"-Dkafka.version={version}", "-DincludeScope=runtime", f"-Dmdep.outputFile={out}"],
        capture_output=True, text=True)
    if result.returncode != 0 or not out.exists():
        raise KafkaUnavailable(f"Maven could not resolve Apache Kafka {version}:\n{result.stdout[-3000:]}"
                               f"{result.stderr[-2000:]}")
    jars = [Path(p) for p in out.read_text().strip().split(os.pathsep) if p]
    out.unlink()
    return jars


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_lock(version: str = KAFKA_VERSION) -> dict[str, str]:
    """jar file name -> SHA-256 from the checked-in lock file."""
    path = lock_file(version)
    if not path.exists():
        raise KafkaUnavailable(f"no checksum file {path} for Apache Kafka {version}")
    entries = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            entries[name] = digest
    return entries


def verify(jars: list[Path], version: str = KAFKA_VERSION) -> None:
    """Refuse a classpath that is not exactly the locked jars with the locked checksums."""
    expected = read_lock(version)
    names = {jar.name: jar for jar in jars}
    problems = [f"missing from the classpath: {n}" for n in sorted(set(expected) - set(names))]
    problems += [f"not in {lock_file(version).name}: {n}" for n in sorted(set(names) - set(expected))]
    for name in sorted(set(expected) & set(names)):
        jar = names[name]
        if not jar.exists():
            problems.append(f"missing on disk: {jar}")
        elif _sha256(jar) != expected[name]:
            problems.append(f"checksum mismatch: {jar}")
    if problems:
        raise KafkaUnavailable(f"Apache Kafka {version} jars failed verification:\n  " + "\n  ".join(problems))


_VERIFIED: dict[str, list[Path]] = {}


def kafka_classpath(version: str = KAFKA_VERSION) -> list[Path]:
    """The verified runtime classpath of Apache Kafka `version` (fetched on first use)."""
    if version in _VERIFIED:
        return _VERIFIED[version]
    cached = cache_dir() / f"kafka-{version}.classpath"
    jars = [Path(p) for p in cached.read_text().split(os.pathsep)] if cached.exists() else []
    if not jars or not all(j.exists() for j in jars):
        jars = _resolve(version)
    verify(jars, version)
    cached.write_text(os.pathsep.join(str(j) for j in jars))
    _VERIFIED[version] = jars
    return jars


def write_lock(version: str = KAFKA_VERSION) -> Path:
    jars = _resolve(version)
    lines = [f"# SHA-256 of every runtime jar of Apache Kafka {version} (deploy/kafka/pom.xml); "
             "written by `python -m gpusched_common.infra.kafka lock`"]
    lines += [f"{_sha256(j)}  {j.name}" for j in sorted(jars, key=lambda j: j.name)]
    lock_file(version).write_text("\n".join(lines) + "\n")
    return lock_file(version)


def _java(main: str, args: list[str], *, heap_mb: int, log4j: Path) -> list[str]:
    classpath = os.pathsep.join(str(j) for j in kafka_classpath())
    opts = os.environ.get("GPUSCHED_KAFKA_JVM_OPTS", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1").split()
    return [java_binary(), f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m", *opts, "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath, main, *args]


def run_tool(main: str, args: list[str], *, home: Path) -> str:
    """Run one of Kafka's command-line tools (e.g. org.apache.kafka.tools.AclCommand); its output."""
    log4j = _log4j_file(home)
    result = subprocess.run(_java(main, args, heap_mb=128, log4j=log4j), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{main} failed ({result.returncode}): {(result.stderr or result.stdout)[-2000:]}")
    return result.stdout


def _log4j_file(home: Path) -> Path:
    path = home / "kafka-log4j2.properties"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        path.write_text(_LOG4J)
    return path


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


@dataclass
class KafkaServer:
    """One single-node KRaft cluster (broker + controller in one JVM)."""

    home: str  # its own directory: server.properties, data/, logs
    port: int
    controller_port: int
    pid: int = 0
    advertised: str = ""  # the bootstrap address clients use (the first listener by default)
    format_args: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.advertised or f"127.0.0.1:{self.port}"

    @property
    def config(self) -> Path:
        return Path(self.home) / "server.properties"

    @property
    def log(self) -> Path:
        return Path(self.home) / "kafka.log"


def local_properties(port: int, controller_port: int, data_dir: Path) -> dict[str, str]:
    """A single-node broker sized for a laptop or CI runner. Consumer groups may use short sessions
    (tests and the local stack run 2-3 s; Kafka's own floor is 6 s) and join without the 3 s initial
    rebalance delay; topics are created by gpusched, never on first use."""
    return {
        "process.roles": "broker,controller", "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir), "num.partitions": "1", "default.replication.factor": "1",
        "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "6",
        "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1", "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0", "group.min.session.timeout.ms": "500",
        "auto.create.topics.enable": "false",
    }


def _formatted_template(home: Path, format_args: list[str]) -> Path:
    """A storage directory formatted once per argument set and cached; brokers start from a copy."""
    key = hashlib.sha256("\0".join([KAFKA_VERSION, *format_args]).encode()).hexdigest()[:12]
    template = cache_dir() / f"kafka-{KAFKA_VERSION}-storage-{key}"
    if (template / "meta.properties").exists():
        return template
    scratch = Path(str(template) + f".tmp{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    props = local_properties(free_port(), free_port(), scratch)
    config = home / "format.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    run_tool("kafka.tools.StorageTool", ["format", "-t", new_cluster_id(), "-c", str(config), *format_args],
             home=home)
    config.unlink()
    try:
        scratch.rename(template)
    except OSError:  # a concurrent formatter won
        shutil.rmtree(scratch, ignore_errors=True)
    return template


def start_kafka(home: Path, *, port: int | None = None, controller_port: int | None = None,
                overrides: dict[str, str] | None = None, format_args: list[str] | None = None,
                advertised: str = "", heap_mb: int = 384, timeout_s: float = 90.0) -> KafkaServer:
    """Start a broker whose files live under `home`; `overrides` replace or add server properties
    (listeners with security, say), `format_args` go to `kafka-storage format` (e.g. --add-scram)."""
    home.mkdir(parents=True, exist_ok=True)
    server = KafkaServer(str(home), port or free_port(), controller_port or free_port(), advertised=advertised,
                         format_args=list(format_args or []))
    data = home / "data"
    props = {**local_properties(server.port, server.controller_port, data), **(overrides or {})}
    server.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    if not (data / "meta.properties").exists():
        shutil.copytree(_formatted_template(home, server.format_args), data)
    return _launch(server, heap_mb=heap_mb, timeout_s=timeout_s)


def _launch(server: KafkaServer, *, heap_mb: int, timeout_s: float) -> KafkaServer:
    home = Path(server.home)
    start = server.log.stat().st_size if server.log.exists() else 0
    argv = _java("kafka.Kafka", [str(server.config)], heap_mb=heap_mb, log4j=_log4j_file(home))
    server.pid = spawn("kafka", argv, home, dict(os.environ))
    try:
        wait_for_port(server.port, timeout_s, pid=server.pid, log=server.log)
        deadline = time.monotonic() + timeout_s
        while STARTED_LINE not in _read_from(server.log, start):
            if not alive(server.pid):
                raise RuntimeError(f"Apache Kafka exited while starting:\n{_read_from(server.log, start)[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Apache Kafka did not start within {timeout_s}s; see {server.log}")
            time.sleep(0.05)
    except BaseException:
        stop_pid(server.pid)  # a broker that never came up must not outlive the caller
        raise
    return server


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def stop_kafka(server: KafkaServer, timeout_s: float = 30.0) -> None:
    """A controlled shutdown (SIGTERM: the broker flushes and closes its logs), SIGKILL after timeout_s."""
    if server.pid:
        stop_pid(server.pid, timeout_s)


def restart_kafka(server: KafkaServer, *, heap_mb: int = 384, timeout_s: float = 90.0) -> KafkaServer:
    """Stop and start the same broker on the same ports and data: nothing acknowledged is lost."""
    stop_kafka(server)
    return _launch(server, heap_mb=heap_mb, timeout_s=timeout_s)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "fetch"
    try:
        if command == "fetch":
            jars = kafka_classpath()
            print(f"Apache Kafka {KAFKA_VERSION}: {len(jars)} jars verified against {lock_file().name}")
        elif command == "lock":
            print(f"wrote {write_lock()}")
        else:
            print("usage: python -m gpusched_common.infra.kafka [fetch|lock]", file=sys.stderr)
            return 2
    except KafkaUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
