"""Apache Kafka with its own security switched on: TLS, SCRAM-SHA-512 users and ACLs.

A shared broker must not let anyone who reaches its port read or forge scheduling events, so it should
run one SASL_SSL listener: TLS keeps credentials and events private, SCRAM-SHA-512 says who a client is
(the broker stores salted hashes only), and the StandardAuthorizer with `allow.everyone.if.no.acl.found=false`
lets each principal do only what its ACLs grant (`acl_layout()` is gpusched's intended layout). The KRaft
controller's listener is authenticated too: a Kafka 4 admin client may talk to a controller directly, and
whoever the controller takes for a super user may rewrite ACLs, topics and configs. It speaks SASL_SSL with
the PLAIN mechanism (SCRAM credentials live in the metadata log the controller itself serves, so KRaft's
controller listener cannot use SCRAM), knows only the admin (with the admin's password, which PLAIN sends
inside TLS only), and the broker logs in to it as the admin.

`start_secure_kafka()` builds such a broker on loopback for tests and local stacks: a throwaway CA and
broker certificate made with the JDK's keytool (no Python crypto dependency), users bootstrapped into the
metadata log at format time (`--add-scram`), and an admin client config for Kafka's own tools; `add_acls()`
grants ACLs through `org.apache.kafka.tools.AclCommand` as the admin.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpusched_common.infra import kafka
from gpusched_common.infra.processes import free_port
from gpusched_common.topics import (
    CLUSTER_SCALING, DEADLETTER, GROUP_ADMISSION, GROUP_ADMISSION_CONTROL, GROUP_METRICS, GROUP_PLACEMENT_CONTROL, GROUP_PLACEMENT_JOBS, GROUP_PLACEMENT_NODES, GROUP_PREEMPTION,
    GROUP_PREEMPTION_RECLAIMS, GROUP_QUOTA, GROUP_QUOTA_ADMIN,
    JOBS_CONTROL, JOBS_EVENTS, JOBS_SUBMITTED, NODES_COMMANDS, NODES_REPORTS, NODES_TELEMETRY, QUOTA_RECLAIMS, TENANCY_UPDATES,
    agent_group,
)

SCRAM = "SCRAM-SHA-512"
ADMIN = "admin"
LISTENER = "SASL_SSL"
CONTROLLER = "CONTROLLER"  # kafka.local_properties' controller.listener.names
CONTROLLER_MECHANISM = "PLAIN"
ACL_COMMAND = "org.apache.kafka.tools.AclCommand"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# Names and passwords travel inside `[name=...,password=...]`, a JAAS string and a .properties file, each
# with its own quoting; a conservative alphabet needs none of it (secrets.token_urlsafe fits).
_SAFE = re.compile(r"[A-Za-z0-9._~-]+")
_KEYTOOL_JVM = ["-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC"]  # halves each keytool start


class SecurityUnavailable(kafka.KafkaUnavailable):
    """keytool (part of the JDK) is missing."""


def _checked(kind: str, value: str) -> str:
    if not _SAFE.fullmatch(value):
        shown = "" if kind == "password" else f" (got {value!r})"  # a password never reaches a log
        raise ValueError(f"a Kafka {kind} may only use letters, digits and . _ ~ -{shown}")
    return value


# --- certificates ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Certificates:
    keystore: Path  # PKCS12: the broker's key and its chain (broker certificate, CA)
    ca_pem: Path  # the CA certificate: what clients trust (GPUSCHED_KAFKA_SSL_CAFILE)
    password: str  # the keystore's (and key's) password


def _keytool(*args: str) -> None:
    tool = shutil.which("keytool", path=str(Path(kafka.java_binary()).parent)) or shutil.which("keytool")
    if not tool:
        raise SecurityUnavailable("making a test certificate needs keytool (part of every JDK) on PATH")
    result = subprocess.run([tool, *_KEYTOOL_JVM, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"keytool {args[0]} failed: {(result.stderr or result.stdout)[-2000:]}")


def _side_by_side(*calls: list[str]) -> None:
    """Independent keytool steps in parallel JVMs: each start costs far more than its work."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        for future in [pool.submit(_keytool, *args) for args in calls]:
            future.result()


def generate_certificates(directory: Path, *, dns: Iterable[str] = ("localhost",),
                          ips: Iterable[str] = ("127.0.0.1",), validity_days: int = 2) -> Certificates:
    """A new CA and a broker certificate it signed for `dns`/`ips` (clients verify the host name, so the
    certificate names every address they dial). The CA's key stays in `directory`; it is throwaway."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    certs = Certificates(directory / "broker.p12", directory / "ca.pem", secrets.token_urlsafe(18))
    ca_store, csr, signed = directory / "ca.p12", directory / "broker.csr", directory / "broker-chain.pem"
    store = lambda path: ["-keystore", str(path), "-storetype", "PKCS12", "-storepass", certs.password]  # noqa: E731
    key = ["-keyalg", "EC", "-groupname", "secp256r1", "-validity", str(validity_days)]
    _side_by_side(["-genkeypair", "-alias", "ca", "-dname", "CN=gpusched throwaway CA", "-ext", "bc:c", *key,
                   *store(ca_store)],
                  ["-genkeypair", "-alias", "broker", "-dname", "CN=localhost", *key, *store(certs.keystore)])
    _side_by_side(["-exportcert", "-rfc", "-alias", "ca", "-file", str(certs.ca_pem), *store(ca_store)],
                  ["-certreq", "-alias", "broker", "-file", str(csr), *store(certs.keystore)])
    names = ",".join([*(f"dns:{d}" for d in dns), *(f"ip:{i}" for i in ips)])
    _keytool("-gencert", "-rfc", "-alias", "ca", "-infile", str(csr), "-outfile", str(signed),
             "-validity", str(validity_days), "-ext", f"SAN={names}", "-ext", "KU=digitalSignature",
             "-ext", "EKU=serverAuth,clientAuth", *store(ca_store))
    signed.write_text(signed.read_text() + certs.ca_pem.read_text())  # the chain, so the reply installs
    _keytool("-importcert", "-noprompt", "-alias", "broker", "-file", str(signed), *store(certs.keystore))
    csr.unlink()
    return certs


# --- users and broker configuration ----------------------------------------------------------------------

def scram_format_args(users: Mapping[str, str]) -> list[str]:
    """`kafka-storage format` arguments that create every user at format time, so the very first start
    already authenticates the admin (SCRAM users otherwise need a running broker and a user to add them)."""
    args: list[str] = []
    for name, password in users.items():
        args += ["--add-scram", f"{SCRAM}=[name={_checked('user name', name)},"
                                f"password={_checked('password', password)}]"]
    return args


def scram_jaas(username: str, password: str) -> str:
    return (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
            f'username="{_checked("user name", username)}" password="{_checked("password", password)}";')


def controller_jaas(admin: str, password: str) -> str:
    """The controller listener's PLAIN login: `username`/`password` are what the broker (the controller's
    client in this JVM) logs in with, `user_<admin>` the one account the controller accepts."""
    admin, password = _checked("user name", admin), _checked("password", password)
    return (f'org.apache.kafka.common.security.plain.PlainLoginModule required '
            f'username="{admin}" password="{password}" user_{admin}="{password}";')


def broker_overrides(certs: Certificates, *, port: int, controller_port: int, admin_password: str,
                     admin: str = ADMIN, host: str = "127.0.0.1") -> dict[str, str]:
    """Server properties (over `kafka.local_properties`) for one SASL_SSL listener serving clients and
    inter-broker traffic with SCRAM (the broker logs in as `admin`, a super user) and a controller listener
    on loopback that is SASL_SSL too, with PLAIN and the admin as its only user: the broker registers with
    its controller, and forwards requests to it, as the admin. No listener yields User:ANONYMOUS, and
    only the admin is a super user."""
    controller = CONTROLLER.lower()
    return {
        "listeners": f"{LISTENER}://{host}:{port},{CONTROLLER}://127.0.0.1:{controller_port}",
        "advertised.listeners": f"{LISTENER}://{host}:{port}",
        "listener.security.protocol.map": f"{LISTENER}:SASL_SSL,{CONTROLLER}:SASL_SSL",
        "inter.broker.listener.name": LISTENER,
        "sasl.enabled.mechanisms": SCRAM, "sasl.mechanism.inter.broker.protocol": SCRAM,
        f"listener.name.{LISTENER.lower()}.{SCRAM.lower()}.sasl.jaas.config": scram_jaas(admin, admin_password),
        f"listener.name.{controller}.sasl.enabled.mechanisms": CONTROLLER_MECHANISM,
        "sasl.mechanism.controller.protocol": CONTROLLER_MECHANISM,
        f"listener.name.{controller}.{CONTROLLER_MECHANISM.lower()}.sasl.jaas.config":
            controller_jaas(admin, admin_password),
        "ssl.keystore.type": "PKCS12", "ssl.keystore.location": str(certs.keystore),
        "ssl.keystore.password": certs.password, "ssl.key.password": certs.password,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(certs.ca_pem),
        "ssl.client.auth": "none",
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{_checked('user name', admin)}",
        "allow.everyone.if.no.acl.found": "false",
    }


def client_properties(ca_pem: Path, username: str, password: str) -> dict[str, str]:
    """A Java client's config (Kafka's CLI tools take it as --command-config) for one SCRAM user."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM,
            "sasl.jaas.config": scram_jaas(username, password),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca_pem)}


def write_secret(path: Path, text: str) -> Path:
    """A file only this user can read (a password file, a config holding a password)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


@dataclass
class SecureKafka:
    """A running secured broker and what a client or Kafka's tools need to reach it as the admin."""

    server: kafka.KafkaServer
    certificates: Certificates
    admin_config: Path  # the admin's client properties, for Kafka's CLI tools
    home: Path

    @property
    def bootstrap(self) -> str:
        return self.server.bootstrap


def start_secure_kafka(home: Path, users: Mapping[str, str], *, admin: str = ADMIN,
                       heap_mb: int = 384) -> SecureKafka:
    """A single-node broker under `home` that only speaks SASL_SSL, knows `users` (name -> password;
    `admin` among them is its super user) and denies everything else until ACLs grant it."""
    if admin not in users:
        raise ValueError(f"the users must include the admin {admin!r}")
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)  # server.properties holds the keystore and admin passwords
    certs = generate_certificates(home / "tls")
    port, controller_port = free_port(), free_port()
    overrides = broker_overrides(certs, port=port, controller_port=controller_port, admin_password=users[admin],
                                 admin=admin)
    server = kafka.start_kafka(home / "kafka", port=port, controller_port=controller_port, overrides=overrides,
                               format_args=scram_format_args(users), heap_mb=heap_mb)
    props = client_properties(certs.ca_pem, admin, users[admin])
    config = write_secret(home / "admin.properties", "".join(f"{k}={v}\n" for k, v in props.items()))
    return SecureKafka(server, certs, config, home)


def settings_fields(secure: SecureKafka, username: str, password_file: Path) -> dict[str, object]:
    """Settings keyword arguments (GPUSCHED_KAFKA_*) with which a gpusched process is `username`."""
    return {"kafka_bootstrap": secure.bootstrap, "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": SCRAM, "kafka_sasl_username": username,
            "kafka_sasl_password_file": password_file, "kafka_ssl_cafile": secure.certificates.ca_pem}


# --- ACLs -------------------------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW entry: `principal` may do `operation` (Kafka's name: Read, Write, Describe...) on a
    `resource` ("topic", "group", "cluster") called `name` (a literal name unless `pattern` is "prefixed";
    the cluster's name is always "kafka-cluster")."""

    principal: str
    operation: str
    resource: str
    name: str
    pattern: str = "literal"


@dataclass(frozen=True)
class ServiceAccess:
    reads: tuple[tuple[str, str], ...]  # (topic, consumer group) pairs the service consumes
    writes: tuple[str, ...]  # topics it produces to (its outbox relay, its dead letters)


# What each service consumes and produces (each app.py's subscriptions and outbox topics). Every consumer
# built by `messaging` dead-letters what it cannot handle, so each consumer may write gpusched.deadletter;
# without it one poison message would stop its partition for good.
SERVICE_ACCESS: dict[str, ServiceAccess] = {
    "admission": ServiceAccess(((JOBS_SUBMITTED.name, GROUP_ADMISSION), (JOBS_CONTROL.name, GROUP_ADMISSION_CONTROL)),
                               (JOBS_EVENTS.name, DEADLETTER.name)),
    "quota": ServiceAccess(((JOBS_EVENTS.name, GROUP_QUOTA), (TENANCY_UPDATES.name, GROUP_QUOTA_ADMIN)),
                           (JOBS_EVENTS.name, QUOTA_RECLAIMS.name, DEADLETTER.name)),
    "placement": ServiceAccess(((JOBS_EVENTS.name, GROUP_PLACEMENT_JOBS),
                                (NODES_REPORTS.name, GROUP_PLACEMENT_NODES),
                                (JOBS_CONTROL.name, GROUP_PLACEMENT_CONTROL)),
                               (JOBS_EVENTS.name, NODES_COMMANDS.name, DEADLETTER.name)),
    "preemption": ServiceAccess(((JOBS_EVENTS.name, GROUP_PREEMPTION),
                                 (QUOTA_RECLAIMS.name, GROUP_PREEMPTION_RECLAIMS)),
                                (JOBS_EVENTS.name, NODES_COMMANDS.name, DEADLETTER.name)),
    "metrics": ServiceAccess(((NODES_TELEMETRY.name, GROUP_METRICS),), (CLUSTER_SCALING.name,)),
    # the operator's CLI: submissions and tenancy revisions (creating topics stays with the admin)
    "cli": ServiceAccess((), (JOBS_SUBMITTED.name, TENANCY_UPDATES.name)),
    # the gateway: submissions and control requests, signed as its producer
    "gateway": ServiceAccess((), (JOBS_SUBMITTED.name, JOBS_CONTROL.name)),
}


def node_principal(node_id: str) -> str:
    return f"User:node-{_checked('node id', node_id)}"


def service_principal(service: str) -> str:
    return f"User:gpusched-{_checked('service name', service)}"


def node_acls(node_id: str, *, principal: str | None = None, group: str | None = None) -> list[Acl]:
    """A node agent reports and sends telemetry, reads its commands in its own group and may dead-letter a
    command it cannot read; nothing else, so a compromised node cannot forge jobs, commands for other
    nodes or other nodes' offsets. A fleet process passes its group (agent_group("fleet-<id>"))."""
    who = principal or node_principal(node_id)
    writes = [Acl(who, "Write", "topic", t.name) for t in (NODES_REPORTS, NODES_TELEMETRY, DEADLETTER)]
    return [*writes, Acl(who, "Read", "topic", NODES_COMMANDS.name),
            Acl(who, "Read", "group", group or agent_group(node_id))]


def service_acls(service: str, *, principal: str | None = None) -> list[Acl]:
    """Read on each topic the service consumes and on its group there, Write on each topic it produces."""
    access = SERVICE_ACCESS[service]
    who = principal or service_principal(service)
    reads = [acl for topic, group in access.reads
             for acl in (Acl(who, "Read", "topic", topic), Acl(who, "Read", "group", group))]
    return sorted(set(reads) | {Acl(who, "Write", "topic", topic) for topic in access.writes})


def acl_layout(node_ids: Iterable[str] = (), services: Iterable[str] = tuple(SERVICE_ACCESS)) -> list[Acl]:
    """gpusched's ACLs for these nodes and services: data only, for `add_acls` or a review."""
    acls = [acl for node_id in node_ids for acl in node_acls(node_id)]
    return acls + [acl for service in services for acl in service_acls(service)]


def acl_command_args(acls: Iterable[Acl]) -> list[list[str]]:
    """AclCommand --add argument lists that add exactly `acls`. The tool grants every --operation on every
    resource it is given, so one call per (principal, operation, pattern) adds no more than asked, with
    the fewest JVM starts."""
    grouped: dict[tuple[str, str, str], list[Acl]] = {}
    for acl in acls:
        grouped.setdefault((acl.principal, acl.operation, acl.pattern), []).append(acl)
    commands = []
    for (principal, operation, pattern), members in grouped.items():
        args = ["--add", "--allow-principal", principal, "--operation", operation,
                "--resource-pattern-type", pattern]
        for acl in members:
            args += ["--cluster"] if acl.resource == "cluster" else [f"--{acl.resource}", acl.name]
        commands.append(args)
    return commands


_LISTED_RESOURCE = re.compile(r"ResourcePattern\(resourceType=(\w+), name=(.*?), patternType=(\w+)\)`:\n"
                              r"((?:[ \t]*\(principal=.*\)\n?)*)")
_LISTED_ENTRY = re.compile(r"\(principal=(.*?), host=\*, operation=(\w+), permissionType=ALLOW\)")


def parse_acl_listing(text: str) -> set[Acl]:
    """The ALLOW-from-any-host entries in AclCommand's "Current ACLs for resource ..." output, as `Acl`s
    (Kafka prints TOPIC/WRITE where AclCommand takes topic/Write)."""
    found = set()
    for kind, name, pattern, entries in _LISTED_RESOURCE.findall(text):
        for principal, operation in _LISTED_ENTRY.findall(entries):
            found.add(Acl(principal, "".join(p.capitalize() for p in operation.split("_")),
                          kind.lower().replace("_", "-"), name, pattern.lower()))
    return found


def _acl_tool(secure: SecureKafka, args: list[str]) -> str:
    return kafka.run_tool(ACL_COMMAND, ["--bootstrap-server", secure.bootstrap, "--command-config",
                                        str(secure.admin_config), *args], home=secure.home)


def listed_acls(secure: SecureKafka) -> set[Acl]:
    """Every ACL the broker reports (DescribeAcls is answered from the broker's own authorizer)."""
    return parse_acl_listing(_acl_tool(secure, ["--list"]))


def add_acls(secure: SecureKafka, acls: Iterable[Acl], *, timeout_s: float = 30.0) -> None:
    """Grant `acls` as the admin and return once the broker lists every one of them: CreateAcls returns
    when the controller has committed them, and the broker applies the metadata a moment later, so a
    client that raced ahead could still be refused. The AclCommand JVMs run side by side."""
    wanted = set(acls)
    commands = acl_command_args(sorted(wanted))
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(commands)))) as pool:
        list(pool.map(lambda args: _acl_tool(secure, args), commands))
    deadline = time.monotonic() + timeout_s
    while missing := wanted - listed_acls(secure):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker does not list these ACLs after {timeout_s}s: {sorted(missing)}")
        time.sleep(0.2)
