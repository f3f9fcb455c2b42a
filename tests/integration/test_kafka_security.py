"""Kafka's own security on the real Apache Kafka broker: one SASL_SSL listener (TLS + SCRAM-SHA-512) and
the StandardAuthorizer denying whatever no ACL allows (infra/kafka_security.py). Real aiokafka and
faststream clients prove that nobody without credentials or with a wrong password gets in, that an
authenticated principal gets exactly its ACLs, and that gpusched's Settings reach every client. The KRaft
controller's own port (SASL_SSL with PLAIN, the admin its only user) lets nobody else in either.

One broker serves the whole module (starting a JVM costs seconds); each test uses its own record values
or groups, so the tests do not depend on each other's order.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError, GroupAuthorizationFailedError, KafkaConnectionError, SaslAuthenticationFailed,
    TopicAuthorizationFailedError, UnsupportedSaslMechanismError,
)
from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import ConsumerRecord

from gpusched_common.infra import kafka, kafka_security
from gpusched_common.infra.kafka_security import ADMIN, SecureKafka
from gpusched_common.kafka_admin import TopicCreationFailed, create_topics, partition_count
from gpusched_common.kafka_client import client_options
from gpusched_common.messaging import Incoming, build_broker, publish, subscribe
from gpusched_common.partitioning import partition_for
from gpusched_common.settings import Settings
from gpusched_common.topics import (
    ALL_TOPICS, DEADLETTER, JOBS_EVENTS, JOBS_SUBMITTED, NODE_COMMAND_PARTITIONS, NODES_COMMANDS, NODES_REPORTS,
    NODES_TELEMETRY, agent_group,
)

NODE_ID = "n1"
NODE = kafka_security.node_principal(NODE_ID).removeprefix("User:")
STRANGER = "stranger"  # authenticates, has no ACLs
# Test-only passwords of a throwaway broker. Fixed, because the formatted storage (which holds the SCRAM
# users) is cached per set of format arguments: the same users skip a storage-format JVM on every run.
USERS = {ADMIN: "admin-test-password", NODE: "node-test-password", STRANGER: "stranger-test-password"}
NODE_WRITES = {NODES_REPORTS.name, NODES_TELEMETRY.name, DEADLETTER.name}


@dataclass
class Secured:
    broker: SecureKafka
    secrets: Path
    created: list[str]  # what kafka_admin.create_topics created as the admin

    def settings(self, user: str, **extra) -> Settings:
        fields = kafka_security.settings_fields(self.broker, user, self.secrets / user)
        return Settings(**fields, kafka_session_timeout_ms=2000, **extra)

    def options(self, user: str) -> dict:
        return client_options(self.settings(user))

    def tls(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.broker.certificates.ca_pem))

    def sasl(self, user: str, password: str) -> dict:
        return {"bootstrap_servers": self.broker.bootstrap, "security_protocol": "SASL_SSL",
                "ssl_context": self.tls(), "sasl_mechanism": kafka_security.SCRAM,
                "sasl_plain_username": user, "sasl_plain_password": password}


def require_kafka() -> None:
    try:
        kafka.java_binary()
        kafka.kafka_classpath()
    except kafka.KafkaUnavailable as exc:
        pytest.skip(f"Apache Kafka cannot run here: {exc}")
    if not shutil.which("keytool"):
        pytest.skip("the test certificate needs keytool (part of every JDK)")


@pytest.fixture(scope="module")
async def secured(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Secured]:
    require_kafka()
    home = tmp_path_factory.mktemp("secure-kafka")
    broker = await asyncio.to_thread(kafka_security.start_secure_kafka, home / "broker", USERS)
    try:
        for user, password in USERS.items():
            kafka_security.write_secret(home / "secrets" / user, password + "\n")
        cluster = Secured(broker, home / "secrets", [])
        grant = asyncio.to_thread(kafka_security.add_acls, broker, kafka_security.node_acls(NODE_ID))
        created = create_topics(broker.bootstrap, partitions=1, client=cluster.options(ADMIN))
        _, cluster.created = await asyncio.gather(grant, created)
        yield cluster
    finally:
        kafka.stop_kafka(broker.server)


def host_port(secured: Secured) -> tuple[str, int]:
    host, port = secured.broker.bootstrap.rsplit(":", 1)
    return host, int(port)


def controller_address(secured: Secured) -> tuple[str, int]:
    return "127.0.0.1", secured.broker.server.controller_port


def plain(secured: Secured, user: str, password: str) -> dict:
    """create_conn options for a PLAIN login over TLS: what the controller listener speaks."""
    return {"security_protocol": "SASL_SSL", "ssl_context": secured.tls(), "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user, "sasl_plain_password": password}


# Kafka's codes: resource CLUSTER 4 / ANY 1, pattern LITERAL 3 / ANY 1, operation ALL 2 / ANY 1, ALLOW 3 / ANY 1
STRANGER_MAY_DO_EVERYTHING = CreateAclsRequest(4, "kafka-cluster", 3, f"User:{STRANGER}", "*", 2, 3)


def acls_of(principal: str | None) -> DescribeAclsRequest:
    return DescribeAclsRequest(1, None, 1, principal, None, 1, 1)


async def read_back(options: dict, topic: str, value: bytes, timeout_s: float = 20.0) -> ConsumerRecord:
    """The record with `value` on `topic`, read from the start without a group."""
    consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", enable_auto_commit=False, **options)
    await consumer.start()
    try:
        async with asyncio.timeout(timeout_s):
            while (record := await consumer.getone()).value != value:
                pass
            return record
    finally:
        await consumer.stop()


def unique() -> bytes:
    return f"secure-{uuid.uuid4()}".encode()


async def test_a_plaintext_client_is_cut_off_by_the_tls_listener(secured: Secured) -> None:
    # Kafka's first request in the clear is no TLS handshake: the broker closes the connection
    with pytest.raises(KafkaConnectionError, match="closed"):
        await create_conn(*host_port(secured), security_protocol="PLAINTEXT")
    producer = AIOKafkaProducer(bootstrap_servers=secured.broker.bootstrap)
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        await producer.start()
    await producer.stop()


async def test_a_tls_client_without_sasl_is_cut_off_at_its_first_real_request(secured: Secured) -> None:
    # the handshake succeeds (the client trusts the CA and the name), ApiVersions is answered before
    # authentication, and the metadata request that any produce needs closes the connection
    conn = await create_conn(*host_port(secured), security_protocol="SSL", ssl_context=secured.tls())
    try:
        with pytest.raises(KafkaConnectionError, match="closed"):
            await conn.send(MetadataRequest([]))
    finally:
        conn.close()
    producer = AIOKafkaProducer(bootstrap_servers=secured.broker.bootstrap, security_protocol="SSL",
                                ssl_context=secured.tls())
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        await producer.start()
    await producer.stop()


@pytest.mark.parametrize("user", [ADMIN, "nobody"], ids=["wrong-password", "unknown-user"])
async def test_a_wrong_password_or_an_unknown_user_fails_authentication(secured: Secured, user: str) -> None:
    options = secured.sasl(user, "not-the-password")
    options.pop("bootstrap_servers")
    with pytest.raises(SaslAuthenticationFailed, match="invalid credentials"):
        await create_conn(*host_port(secured), **options)
    # a producer reports the refusal only as a failed bootstrap (aiokafka logs the cause)
    producer = AIOKafkaProducer(**secured.sasl(user, "not-the-password"))
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        await producer.start()
    await producer.stop()


async def test_the_controller_answers_the_admin_logged_in_with_plain(secured: Secured) -> None:
    # the control for the next test: this port is the live controller, and it answers the ACL requests a
    # super user may send it (with User:ANONYMOUS a super user, it answered anybody's)
    conn = await create_conn(*controller_address(secured), **plain(secured, ADMIN, USERS[ADMIN]))
    try:
        response = await conn.send(acls_of(None))
    finally:
        conn.close()
    assert response.error_code == 0
    principals = {acl[0] for resource in response.resources for acl in resource[-1]}
    assert principals == {f"User:{NODE}"}  # the node's ACLs, granted by the fixture


@pytest.mark.parametrize(("options", "refusal", "match"), [
    (lambda s: {"security_protocol": "PLAINTEXT"}, KafkaConnectionError, "closed"),
    (lambda s: {"security_protocol": "SSL", "ssl_context": s.tls()}, KafkaConnectionError, "closed"),
    (lambda s: s.sasl(ADMIN, USERS[ADMIN]), UnsupportedSaslMechanismError, None),  # only PLAIN is enabled
    (lambda s: plain(s, ADMIN, "not-the-password"), SaslAuthenticationFailed, "Invalid username or password"),
    (lambda s: plain(s, STRANGER, USERS[STRANGER]), SaslAuthenticationFailed, "Invalid username or password"),
], ids=["plaintext", "tls-without-sasl", "the-admins-scram-login", "plain-wrong-password", "a-scram-user-via-plain"])
async def test_nobody_but_the_admin_gets_anything_from_the_controller(secured: Secured, options, refusal,
                                                                       match: str | None) -> None:
    # what a local process would try: grant itself everything on the cluster straight at the controller
    opts = options(secured)
    opts.pop("bootstrap_servers", None)

    async def grant_the_stranger_everything() -> None:
        conn = await create_conn(*controller_address(secured), **opts)
        try:
            await conn.send(STRANGER_MAY_DO_EVERYTHING)
        finally:
            conn.close()

    with pytest.raises(refusal, match=match):
        await grant_the_stranger_everything()
    conn = await create_conn(*controller_address(secured), **plain(secured, ADMIN, USERS[ADMIN]))
    try:
        assert (await conn.send(acls_of(f"User:{STRANGER}"))).resources == []
    finally:
        conn.close()


async def test_an_authenticated_principal_without_acls_cannot_produce_to_any_gpusched_topic(
        secured: Secured) -> None:
    async with AIOKafkaProducer(**secured.options(STRANGER)) as producer:
        for topic in ALL_TOPICS:
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(topic.name, unique())


async def test_a_principal_without_acls_cannot_even_start_an_idempotent_producer(secured: Secured) -> None:
    # InitProducerId needs Write on some topic (or IdempotentWrite on the cluster)
    producer = AIOKafkaProducer(enable_idempotence=True, **secured.options(STRANGER))
    with pytest.raises(ClusterAuthorizationFailedError):
        await producer.start()
    await producer.stop()


async def test_a_node_writes_its_reports_and_telemetry(secured: Secured) -> None:
    values = {topic: unique() for topic in (NODES_REPORTS.name, NODES_TELEMETRY.name)}
    async with AIOKafkaProducer(enable_idempotence=True, **secured.options(NODE)) as producer:
        for topic, value in values.items():
            await producer.send_and_wait(topic, value, key=NODE_ID.encode())
    for topic, value in values.items():
        record = await read_back(secured.options(ADMIN), topic, value)
        assert record.key == NODE_ID.encode()


async def test_a_node_cannot_produce_to_any_topic_but_its_reports_telemetry_and_dead_letters(
        secured: Secured) -> None:
    forbidden = [t.name for t in ALL_TOPICS if t.name not in NODE_WRITES]
    assert {JOBS_SUBMITTED.name, NODES_COMMANDS.name} <= set(forbidden)
    async with AIOKafkaProducer(**secured.options(NODE)) as producer:
        for topic in forbidden:
            # nodes.commands: the node may see it (Read), so the produce request itself is refused;
            # every other topic is already hidden from its metadata
            with pytest.raises(TopicAuthorizationFailedError):
                await producer.send_and_wait(topic, unique())


async def test_a_node_consumes_its_commands_in_its_own_group(secured: Secured) -> None:
    """As its agent does (issue 16): the topic's partition count from the metadata, its node's partition
    assigned by hand, the offsets committed under its group."""
    value = unique()
    async with AIOKafkaProducer(**secured.options(ADMIN)) as producer:
        await producer.send_and_wait(NODES_COMMANDS.name, value, key=NODE_ID.encode())
    count = await partition_count(secured.options(NODE), NODES_COMMANDS.name)
    assert count == NODE_COMMAND_PARTITIONS
    mine = TopicPartition(NODES_COMMANDS.name, partition_for(NODE_ID, count))
    consumer = AIOKafkaConsumer(group_id=agent_group(NODE_ID), auto_offset_reset="earliest", enable_auto_commit=False,
                                **secured.options(NODE))
    await consumer.start()
    try:
        consumer.assign([mine])
        async with asyncio.timeout(20):
            while (record := await consumer.getone()).value != value:
                pass
        assert record.partition == mine.partition
        await consumer.commit()  # the group's offsets are the node's too
        assert await consumer.committed(mine) == record.offset + 1
    finally:
        await consumer.stop()


async def test_a_node_may_still_read_another_nodes_commands(secured: Secured) -> None:
    """Reading only its own partition saves traffic; it confines nothing: Kafka's ACLs name topics, not
    partitions (commands are signed for their node, not secret)."""
    value = unique()
    async with AIOKafkaProducer(**secured.options(ADMIN)) as producer:
        meta = await producer.send_and_wait(NODES_COMMANDS.name, value, key=b"n2")
    assert meta.partition != partition_for(NODE_ID, NODE_COMMAND_PARTITIONS)
    consumer = AIOKafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **secured.options(NODE))
    await consumer.start()
    try:
        consumer.assign([TopicPartition(NODES_COMMANDS.name, meta.partition)])
        async with asyncio.timeout(20):
            while (await consumer.getone()).value != value:
                pass
    finally:
        await consumer.stop()


async def test_a_node_cannot_consume_its_commands_in_another_nodes_group(secured: Secured) -> None:
    # refused while starting: the consumer looks up its group's coordinator, which needs Describe on it
    consumer = AIOKafkaConsumer(NODES_COMMANDS.name, group_id=agent_group("n2"), auto_offset_reset="earliest",
                                session_timeout_ms=2000, **secured.options(NODE))
    try:
        with pytest.raises(GroupAuthorizationFailedError, match=agent_group("n2")):
            await consumer.start()
    finally:
        await consumer.stop()


async def test_a_node_cannot_read_job_events(secured: Secured) -> None:
    consumer = AIOKafkaConsumer(JOBS_EVENTS.name, auto_offset_reset="earliest", **secured.options(NODE))
    try:
        with pytest.raises(TopicAuthorizationFailedError, match=JOBS_EVENTS.name):
            await consumer.start()
    finally:
        await consumer.stop()


async def test_kafka_admin_creates_every_topic_with_the_admin_settings(secured: Secured) -> None:
    assert sorted(secured.created) == sorted(t.name for t in ALL_TOPICS)
    # a second run finds them all (and proves the admin sees every topic)
    assert await create_topics(secured.broker.bootstrap, partitions=1, client=secured.options(ADMIN)) == []


async def test_a_principal_without_create_rights_is_told_the_broker_refused_every_topic(secured: Secured) -> None:
    with pytest.raises(TopicCreationFailed) as refused:
        await create_topics(secured.broker.bootstrap, partitions=1, client=secured.options(STRANGER))
    assert str(refused.value).count("TopicAuthorizationFailedError") == len(ALL_TOPICS)


async def test_a_faststream_broker_from_sasl_ssl_settings_publishes_and_its_subscriber_reads_back(
        secured: Secured) -> None:
    settings = secured.settings(ADMIN, kafka_idempotence=True)
    broker = build_broker(settings, client_id="secure-test")
    value, seen = unique(), asyncio.get_running_loop().create_future()

    async def handler(message: Incoming) -> None:
        if message.value == value and not seen.done():
            seen.set_result(message)

    subscribe(broker, topic=JOBS_SUBMITTED.name, group_id="gpusched-secure-test", service="secure-test",
              settings=settings, handler=handler)
    await broker.start()
    try:
        await publish(broker, JOBS_SUBMITTED.name, "job-1", value, {"event-type": "test"})
        message = await asyncio.wait_for(seen, 30)
    finally:
        await broker.stop()
    assert (message.key, message.headers["event-type"]) == ("job-1", "test")
    assert (await read_back(secured.options(ADMIN), JOBS_SUBMITTED.name, value)).offset == message.offset


async def test_a_faststream_broker_with_a_nodes_settings_has_exactly_the_nodes_rights(secured: Secured) -> None:
    # the password comes from the node's password file: the node may report, not submit jobs
    broker = build_broker(secured.settings(NODE, kafka_idempotence=True), client_id="secure-node")
    value = unique()
    await broker.start()
    try:
        await publish(broker, NODES_REPORTS.name, NODE_ID, value)
        with pytest.raises(TopicAuthorizationFailedError):
            await publish(broker, JOBS_SUBMITTED.name, "job-2", unique())
    finally:
        await broker.stop()
    assert (await read_back(secured.options(ADMIN), NODES_REPORTS.name, value)).key == NODE_ID.encode()
