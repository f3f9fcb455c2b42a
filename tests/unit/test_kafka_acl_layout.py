"""gpusched's Kafka ACL layout and the AclCommand plumbing, as data (no broker): a node gets exactly its
topics and group, services get what they consume and produce, and the tool is asked for no more; the
broker's listeners all authenticate, and only the admin is a super user."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched_common.infra.kafka_security import (
    SERVICE_ACCESS, Acl, Certificates, acl_command_args, acl_layout, broker_overrides, controller_jaas,
    node_acls, parse_acl_listing, scram_format_args, service_acls,
)
from gpusched_common.topics import ALL_TOPICS, GROUP_QUOTA_ADMIN, agent_group


def expand(args: list[str]) -> set[Acl]:
    """The ACLs one AclCommand --add call grants: every operation on every resource it names."""
    principal, operation, pattern = args[2], args[4], args[6]
    rest, resources = args[7:], []
    while rest:
        flag = rest.pop(0)
        resources.append(("cluster", "kafka-cluster") if flag == "--cluster" else (flag[2:], rest.pop(0)))
    return {Acl(principal, operation, kind, name, pattern) for kind, name in resources}


def test_a_node_may_write_reports_telemetry_and_dead_letters_and_read_its_commands_in_its_group() -> None:
    who = "User:node-n7"
    assert set(node_acls("n7")) == {
        Acl(who, "Write", "topic", "gpusched.nodes.reports"), Acl(who, "Write", "topic", "gpusched.nodes.telemetry"),
        Acl(who, "Write", "topic", "gpusched.deadletter"), Acl(who, "Read", "topic", "gpusched.nodes.commands"),
        Acl(who, "Read", "group", agent_group("n7")),
    }


def test_a_fleet_process_reads_in_its_fleet_group() -> None:
    groups = {a.name for a in node_acls("f1", group=agent_group("fleet-f1")) if a.resource == "group"}
    assert groups == {agent_group("fleet-f1")}


def test_every_service_topic_exists_and_every_consumed_topic_comes_with_its_group() -> None:
    names = {t.name for t in ALL_TOPICS}
    for service, access in SERVICE_ACCESS.items():
        assert {topic for topic, _ in access.reads} | set(access.writes) <= names, service
        acls = service_acls(service)
        for topic, group in access.reads:
            assert Acl(f"User:gpusched-{service}", "Read", "group", group) in acls
    assert ("gpusched.admin.tenancy", GROUP_QUOTA_ADMIN) in SERVICE_ACCESS["quota"].reads


def test_no_principal_in_the_layout_may_create_alter_or_delete() -> None:
    layout = acl_layout(node_ids=["n1", "n2"])
    assert {a.operation for a in layout} == {"Read", "Write"}
    assert not any(a.pattern != "literal" or a.resource == "cluster" for a in layout)


def test_acl_commands_grant_exactly_the_layout_with_one_call_per_principal_and_operation() -> None:
    layout = acl_layout(node_ids=["n1"])
    commands = acl_command_args(layout)
    assert set().union(*(expand(args) for args in commands)) == set(layout)
    assert len(commands) == len({(a.principal, a.operation) for a in layout})


def test_the_acl_listing_of_kafka_4_reads_back_as_acls() -> None:
    listing = (
        "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=gpusched.nodes.commands, "
        "patternType=LITERAL)`:\n\t(principal=User:node-n1, host=*, operation=READ, permissionType=ALLOW)\n"
        "\t(principal=User:x, host=10.0.0.1, operation=WRITE, permissionType=ALLOW)\n\n"
        "Current ACLs for resource `ResourcePattern(resourceType=CLUSTER, name=kafka-cluster, "
        "patternType=LITERAL)`:\n\t(principal=User:svc, host=*, operation=IDEMPOTENT_WRITE, permissionType=ALLOW)\n"
    )
    assert parse_acl_listing(listing) == {Acl("User:node-n1", "Read", "topic", "gpusched.nodes.commands"),
                                          Acl("User:svc", "IdempotentWrite", "cluster", "kafka-cluster")}


@pytest.mark.parametrize("password", ["with,comma", "close]bracket", 'quote"', "back\\slash", "new\nline", ""])
def test_a_password_that_would_need_quoting_is_refused(password: str) -> None:
    with pytest.raises(ValueError, match="may only use"):
        scram_format_args({"admin": password})


def test_a_refused_password_is_not_repeated_in_the_error() -> None:
    with pytest.raises(ValueError) as refused:
        scram_format_args({"admin": "s3cret,with-comma"})
    assert "s3cret" not in str(refused.value)


def overrides(admin_password: str = "admin-pw") -> dict[str, str]:
    return broker_overrides(Certificates(Path("broker.p12"), Path("ca.pem"), "store-pw"), port=9093,
                            controller_port=9094, admin_password=admin_password)


def test_every_listener_authenticates_and_only_the_admin_is_a_super_user() -> None:
    props = overrides()
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL"
    assert props["super.users"] == "User:admin"
    # KRaft's controller cannot use SCRAM (its users live in the metadata log the controller serves)
    assert props["sasl.mechanism.controller.protocol"] == "PLAIN"
    assert props["listener.name.controller.sasl.enabled.mechanisms"] == "PLAIN"
    jaas = props["listener.name.controller.plain.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required ")
    assert 'username="admin" password="admin-pw" user_admin="admin-pw";' in jaas


def test_a_controller_login_that_would_need_quoting_is_refused_without_repeating_the_password() -> None:
    for name, password in [("admin", 's3cret" user_evil="x'), ('admin" user_evil="x', "s3cret")]:
        with pytest.raises(ValueError, match="may only use") as refused:
            controller_jaas(name, password)
        assert "s3cret" not in str(refused.value)
    with pytest.raises(ValueError, match="may only use"):
        overrides("with space")
