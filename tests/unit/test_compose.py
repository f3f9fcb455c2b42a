"""The production compose file (docker-compose.yml), read as YAML: the gateway is the only published
port and is health-checked on /readyz; Kafka and PostgreSQL are not published; every service runs a
module that exists; admission requires credentials; the gateway's environment names only settings it
has; its producer key lies on a volume that init writes and the gateway only reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.gateway.settings import GatewaySettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
GPUSCHED_IMAGE = "gpusched:"
# being added to GatewaySettings as gateway_producer_key_file; checked once it is there
PENDING_GATEWAY_SETTINGS = {"gateway_producer_key_file"}


def gpusched_services() -> list[str]:
    return [name for name, service in SERVICES.items() if str(service.get("image", "")).startswith(GPUSCHED_IMAGE)]


def module_of(command: list[str]) -> str | None:
    """The module of ``python -m services.X`` (None for any other command, e.g. init's shell)."""
    if command[:2] == ["python", "-m"] and len(command) > 2:
        return command[2]
    return None


def test_the_gateway_is_published_on_one_host_port():
    assert SERVICES["gateway"]["ports"] == ["${GATEWAY_PORT:-8080}:8080"]
    assert SERVICES["gateway"]["environment"]["GPUSCHED_GATEWAY_PORT"] == "8080"
    assert SERVICES["gateway"]["environment"]["GPUSCHED_GATEWAY_HOST"] == "0.0.0.0"


def test_the_gateway_is_healthy_only_when_readyz_answers():
    test = SERVICES["gateway"]["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and any("http://127.0.0.1:8080/readyz" in part for part in test)


def test_no_service_but_the_gateway_publishes_a_port():
    assert [name for name, service in SERVICES.items() if service.get("ports")] == ["gateway"]
    assert "ports" not in SERVICES["kafka"] and "ports" not in SERVICES["postgres"]


@pytest.mark.parametrize("name", gpusched_services())
def test_every_gpusched_service_runs_a_module_that_exists(name):
    command = SERVICES[name]["command"]
    module = module_of(command)
    if module is None:
        assert name == "init", f"{name} runs {command!r}, not `python -m services.X`"
        return
    assert module.startswith("services.")
    assert (ROOT / Path(*module.split(".")) / "__main__.py").is_file(), f"{name}: no module {module}"


def test_admission_requires_a_credential_on_every_submission():
    assert str(SERVICES["admission"]["environment"]["GPUSCHED_ADMISSION_REQUIRE_CREDENTIALS"]).lower() == "true"


def test_the_gateway_environment_names_only_its_settings():
    fields = set(GatewaySettings.model_fields)
    names = {key.removeprefix("GPUSCHED_").lower() for key in SERVICES["gateway"]["environment"]}
    assert all(key.startswith("GPUSCHED_") for key in SERVICES["gateway"]["environment"])
    assert names - fields - PENDING_GATEWAY_SETTINGS == set()


def test_the_gateway_reads_as_its_own_role_never_as_the_superuser():
    env = SERVICES["gateway"]["environment"]
    assert env["GPUSCHED_GATEWAY_DATABASE_URL"].startswith("postgresql://gpusched_gateway:${GATEWAY_DB_PASSWORD")
    assert env["GPUSCHED_DATABASE_URL"] == env["GPUSCHED_GATEWAY_DATABASE_URL"]


def test_init_writes_the_gateway_key_that_the_gateway_only_reads():
    key_file = SERVICES["gateway"]["environment"]["GPUSCHED_GATEWAY_PRODUCER_KEY_FILE"]
    script = SERVICES["init"]["command"][-1]
    assert f"gpusched gateway-init --producer-key-file {key_file}" in script
    assert "--role-password-file" in script
    assert "gateway-secrets" in COMPOSE["volumes"]
    secrets_dir = str(Path(key_file).parent)
    assert f"gateway-secrets:{secrets_dir}" in SERVICES["init"]["volumes"]
    assert f"gateway-secrets:{secrets_dir}:ro" in SERVICES["gateway"]["volumes"]
    assert [name for name, service in SERVICES.items()
            if any(str(v).startswith("gateway-secrets:") for v in service.get("volumes", []))] == ["init", "gateway"]


def test_every_agent_serves_logs_to_the_gateway_with_the_public_key_init_writes():
    script = SERVICES["init"]["command"][-1]
    public = script.split("--public-key-file ")[1].split()[0]
    assert f"gateway-public:{Path(public).parent}" in SERVICES["init"]["volumes"]
    agents = [name for name in SERVICES if name.startswith("node-agent")]
    assert agents
    for name in agents:
        env = SERVICES[name]["environment"]
        assert env["GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE"] == public, name
        assert env["GPUSCHED_AGENT_LOG_URL"] == f"http://{SERVICES[name]['hostname']}:{env['GPUSCHED_AGENT_LOG_PORT']}"
        assert f"gateway-public:{Path(public).parent}:ro" in SERVICES[name]["volumes"], name


def test_every_agent_enrols_with_the_join_token_init_writes_and_only_agents_read_it():
    script = SERVICES["init"]["command"][-1]
    token_file = script.split("join-token create")[1].split("--file ")[1].split()[0].rstrip(";")
    assert f"node-join:{Path(token_file).parent}" in SERVICES["init"]["volumes"]
    agents = [name for name in SERVICES if name.startswith("node-agent")]
    for name in agents:
        assert SERVICES[name]["environment"]["GPUSCHED_AGENT_JOIN_TOKEN_FILE"] == token_file, name
        assert f"node-join:{Path(token_file).parent}:ro" in SERVICES[name]["volumes"], name
    readers = [name for name, service in SERVICES.items()
               if any(str(v).startswith("node-join:") for v in service.get("volumes", []))]
    assert sorted(readers) == sorted(["init", *agents])
