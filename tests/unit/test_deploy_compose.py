"""docker-compose.yml, checked without Docker: valid against the compose specification's published JSON
schema (pinned by checksum), and the rules that make it run: every process has the settings it needs
and names only settings it has; node agents get no database credentials; state and keys live on
writable volumes at absolute paths the image's user owns; the gateway and metrics ports are published
(and nothing else); secrets come from files mounted at run time; traces go to a collector compose runs;
Kafka is the version the suite runs."""

from __future__ import annotations

import copy
import re
from pathlib import PurePosixPath

import jsonschema
import pytest
import yaml

from gpusched_common.infra import kafka
from gpusched_common.settings import Settings
from tests.unit.test_deploy_support import (
    AGENT,
    COMPOSE_SCHEMA_SHA256,
    CONTROL_PLANE,
    DOCKERFILE,
    GATEWAY,
    ROOT,
    SETTINGS_BY_MODULE,
    compose,
    compose_schema,
    compose_schema_bytes,
    compose_text,
    entrypoint_file_settings,
    in_build_context,
    interpolate,
    module_of,
    setting_names,
    sha256,
)

DOC = compose()
SERVICES: dict[str, dict] = DOC["services"]
GPUSCHED_IMAGE = "gpusched:"


def gpusched_services() -> list[str]:
    return [name for name, s in SERVICES.items() if str(s.get("image", "")).startswith(GPUSCHED_IMAGE)]


def by_module(module: str) -> list[str]:
    return [name for name in gpusched_services() if module_of(SERVICES[name].get("command")) == module]


def agents() -> list[str]:
    return by_module(AGENT)


def env_of(name: str) -> dict[str, str]:
    env = SERVICES[name].get("environment") or {}
    assert isinstance(env, dict), f"{name}: environment as a mapping"
    return {k: str(v) for k, v in env.items()}


def secret_targets(name: str) -> dict[str, str]:
    """Where each secret of the service is mounted: /run/secrets/<name> (short syntax) or its target."""
    out = {}
    for entry in SERVICES[name].get("secrets") or []:
        source = entry if isinstance(entry, str) else entry["source"]
        target = source if isinstance(entry, str) else entry.get("target", source)
        out[source] = target if target.startswith("/") else f"/run/secrets/{target}"
    return out


def config_targets(name: str) -> dict[str, str]:
    return {entry["source"]: entry["target"] for entry in SERVICES[name].get("configs") or []}


def mounts(name: str) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each volume of the service (short syntax)."""
    out = []
    for entry in SERVICES[name].get("volumes") or []:
        parts = str(entry).split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def mounted_at(name: str, path: str) -> tuple[str, bool] | None:
    """('volume'|'secret'|'config', writable) for what holds ``path`` in the service's container."""
    for target in secret_targets(name).values():
        if path == target:
            return ("secret", False)
    for target in config_targets(name).values():
        if path == target:
            return ("config", False)
    for _, target, read_only in mounts(name):
        if PurePosixPath(path).is_relative_to(target):
            return ("volume", not read_only)
    return None


# -- the published schema ---------------------------------------------------------------------------


def test_the_compose_schema_is_the_pinned_one():
    assert sha256(compose_schema_bytes()) == COMPOSE_SCHEMA_SHA256


def test_the_compose_file_is_valid_against_the_compose_specification():
    validator = jsonschema.Draft202012Validator(compose_schema())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(DOC)]
    assert errors == []


def test_the_schema_refuses_what_compose_refuses():
    """The validation is not vacuous: an unknown service key and a wrongly typed one are refused."""
    validator = jsonschema.Draft202012Validator(compose_schema())
    unknown, mistyped = copy.deepcopy(DOC), copy.deepcopy(DOC)
    unknown["services"]["gateway"]["portz"] = ["8080:8080"]
    mistyped["services"]["metrics"]["ports"] = {"9100": 9100}
    assert not validator.is_valid(unknown) and not validator.is_valid(mistyped)


def test_every_variable_has_a_default_so_compose_config_needs_no_env_file():
    interpolate(yaml.safe_load(compose_text()), {})  # a required variable without a value raises
    assert "${GPUSCHED_TAG:-local}" in compose_text() and DOC["services"]["gateway"]["image"] == "gpusched:local"


# -- what each process runs with --------------------------------------------------------------------


@pytest.mark.parametrize("name", gpusched_services())
def test_every_gpusched_service_runs_a_module_that_exists(name):
    module = module_of(SERVICES[name]["command"])
    if module is None:
        assert name == "init", f"{name} runs {SERVICES[name]['command']!r}, not `python -m services.X`"
        return
    assert (ROOT / module.replace(".", "/") / "__main__.py").is_file(), f"{name}: no module {module}"


def test_every_service_and_the_gateway_and_agents_are_there():
    modules = {module_of(SERVICES[name].get("command")) for name in gpusched_services()}
    assert set(SETTINGS_BY_MODULE) <= modules
    assert {"kafka", "postgres", "otel-collector", "init"} <= set(SERVICES)
    assert len(agents()) >= 2


@pytest.mark.parametrize("name", gpusched_services())
def test_every_environment_variable_is_a_setting_of_that_process(name):
    module = module_of(SERVICES[name]["command"])
    cls = SETTINGS_BY_MODULE.get(module, Settings)
    gpusched = {key for key in env_of(name) if key.startswith("GPUSCHED_")}
    assert gpusched - setting_names(cls) == set(), f"{name}: not settings of {cls.__name__}"
    assert set(env_of(name)) - gpusched <= {"NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_VISIBLE_DEVICES"}


@pytest.mark.parametrize("name", gpusched_services())
def test_every_process_reaches_apache_kafka_with_the_idempotent_producer(name):
    env = env_of(name)
    host = env["GPUSCHED_KAFKA_BOOTSTRAP"].split(":")[0]
    assert host == "kafka" and env["GPUSCHED_KAFKA_IDEMPOTENCE"] == "true"


@pytest.mark.parametrize("name", [n for n in gpusched_services() if module_of(SERVICES[n]["command"]) != AGENT])
def test_the_control_plane_reads_its_database_url_from_a_mounted_secret(name):
    env = env_of(name)
    assert "GPUSCHED_DATABASE_URL" not in env, f"{name}: a password in the container's configuration"
    path = env["GPUSCHED_DATABASE_URL_FILE"]
    assert mounted_at(name, path) == ("secret", False), f"{name}: {path} is no secret of it"


def test_the_entrypoint_reads_the_database_urls_from_files():
    assert entrypoint_file_settings() == ["GPUSCHED_DATABASE_URL", "GPUSCHED_GATEWAY_DATABASE_URL"]
    assert re.search(r'^ENTRYPOINT \["gpusched-entrypoint"\]$', DOCKERFILE.read_text(), re.M)


@pytest.mark.parametrize("name", agents())
def test_agents_get_no_database_credentials(name):
    env = env_of(name)
    assert [key for key in env if "DATABASE" in key or key.startswith("PG")] == []
    assert not any("postgres" in value for value in env.values())
    assert secret_targets(name) == {}, f"{name} is given secrets: {secret_targets(name)}"
    assert not any(source in ("postgres-data",) for source, _, _ in mounts(name))


def test_no_database_secret_reaches_a_process_that_does_not_use_it():
    readers = {source: sorted(name for name in SERVICES if source in secret_targets(name))
               for source in DOC["secrets"]}
    assert readers["postgres-password"] == ["postgres"]
    assert readers["database-url"] == sorted(["init", *(n for m in CONTROL_PLANE for n in by_module(m))])
    assert readers["gateway-db-password"] == ["init"]
    assert readers["gateway-database-url"] == by_module(GATEWAY) == ["gateway"]
    assert readers["tenant-keys"] == sorted(by_module("services.admission") + by_module("services.quota"))


@pytest.mark.parametrize("name", gpusched_services())
def test_every_file_a_process_is_told_of_is_mounted_in_its_container(name):
    for key, value in env_of(name).items():
        if key.endswith(("_FILE", "_DIR")) and key.startswith("GPUSCHED_"):
            assert value.startswith("/"), f"{name}: {key}={value} is relative"
            assert mounted_at(name, value) is not None, f"{name}: {key}={value} is on nothing mounted"


def test_admission_requires_a_credential_and_quota_starts_from_the_mounted_tenancy():
    (admission,) = by_module("services.admission")
    assert env_of(admission)["GPUSCHED_ADMISSION_REQUIRE_CREDENTIALS"] == "true"
    (quota,) = by_module("services.quota")
    tenants = env_of(quota)["GPUSCHED_TENANTS_FILE"]
    assert mounted_at(quota, tenants) == ("config", False)
    source = [s for s, target in config_targets(quota).items() if target == tenants][0]
    assert (ROOT / DOC["configs"][source]["file"]).is_file()


@pytest.mark.parametrize("module,key", [("services.placement", "placement"), ("services.preemption", "preemption"),
                                        ("services.metrics", "metrics")])
def test_each_signing_service_reads_its_own_key_that_init_writes(module, key):
    (name,) = by_module(module)
    path = env_of(name)["GPUSCHED_SERVICE_KEY_FILE"]
    assert PurePosixPath(path).name == f"{key}.key"
    script = SERVICES["init"]["command"][-1]
    keys_dir = script.split("--service-keys-dir ")[1].split()[0]
    assert str(PurePosixPath(path).parent) == keys_dir
    assert mounted_at(name, path) == ("volume", False) and mounted_at("init", path) == ("volume", True)


def test_init_writes_the_gateway_key_that_only_the_gateway_reads():
    env = env_of("gateway")
    key_file = env["GPUSCHED_GATEWAY_PRODUCER_KEY_FILE"]
    script = SERVICES["init"]["command"][-1]
    assert f"gpusched gateway-init --producer-key-file {key_file}" in script
    assert mounted_at("init", key_file) == ("volume", True)
    assert mounted_at("gateway", key_file) == ("volume", False)
    volume = [s for s, t, _ in mounts("gateway") if PurePosixPath(key_file).is_relative_to(t)][0]
    assert sorted(n for n in SERVICES if any(s == volume for s, _, _ in mounts(n))) == ["gateway", "init"]


def test_the_gateway_reads_as_its_own_role_and_sets_its_password_from_a_secret():
    env = env_of("gateway")
    assert env["GPUSCHED_GATEWAY_DATABASE_URL_FILE"] == env["GPUSCHED_DATABASE_URL_FILE"]
    assert env["GPUSCHED_GATEWAY_DATABASE_URL_FILE"] == secret_targets("gateway")["gateway-database-url"]
    script = SERVICES["init"]["command"][-1]
    password_file = script.split("--role-password-file ")[1].split()[0]
    assert password_file == secret_targets("init")["gateway-db-password"]


@pytest.mark.parametrize("name", agents())
def test_every_agent_keeps_its_state_and_logs_on_a_writable_volume_of_its_own(name):
    work_dir = env_of(name)["GPUSCHED_AGENT_WORK_DIR"]
    assert work_dir.startswith("/")
    assert mounted_at(name, work_dir) == ("volume", True)
    (source,) = [s for s, t, _ in mounts(name) if t == work_dir]
    assert source in DOC["volumes"], f"{source}: a named volume (docker copies the image's ownership to it)"
    sharers = [n for n in SERVICES if any(s == source for s, _, _ in mounts(n))]
    assert sharers == [name]


@pytest.mark.parametrize("name", agents())
def test_every_agent_trusts_what_init_writes_and_serves_logs_on_its_hostname(name):
    env = env_of(name)
    script = SERVICES["init"]["command"][-1]
    assert env["GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE"] == script.split("--public-key-file ")[1].split()[0]
    assert env["GPUSCHED_AGENT_COMMAND_KEYS_FILE"] == script.split("--command-keys-file ")[1].split()[0]
    token = script.split("join-token create")[1].split("--file ")[1].split()[0].rstrip(";")
    assert env["GPUSCHED_AGENT_JOIN_TOKEN_FILE"] == token
    for key in ("GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE", "GPUSCHED_AGENT_COMMAND_KEYS_FILE",
                "GPUSCHED_AGENT_JOIN_TOKEN_FILE"):
        assert mounted_at(name, env[key]) == ("volume", False), (name, key)
        assert mounted_at("init", env[key]) == ("volume", True), key
    assert env["GPUSCHED_AGENT_LOG_HOST"] == "0.0.0.0"
    assert env["GPUSCHED_AGENT_LOG_URL"] == f"http://{SERVICES[name]['hostname']}:{env['GPUSCHED_AGENT_LOG_PORT']}"


def test_node_ids_are_unique():
    ids = [env_of(name)["GPUSCHED_NODE_ID"] for name in agents()]
    assert len(ids) == len(set(ids))


def test_every_volume_is_declared_and_mounted_at_an_absolute_path():
    for name, service in SERVICES.items():
        for source, target, _ in mounts(name):
            assert target.startswith("/"), f"{name}: {target}"
            assert source in DOC["volumes"], f"{name}: {source} is a bind mount or undeclared"


def dockerfile_owned_dirs() -> set[str]:
    """The directories the Dockerfile creates owned by uid 10001 (`install -d -o 10001 ...`)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    owned = set()
    for match in re.finditer(r"install -d -o 10001 -g 10001 -m \d+ ([^&\n]+)", text):
        owned |= set(match.group(1).split())
    return owned


@pytest.mark.parametrize("name", gpusched_services())
def test_every_volume_of_a_gpusched_container_starts_owned_by_its_user(name):
    """A new named volume takes the ownership of the image's directory it is mounted on, so each mount
    point must exist in the image owned by the user the container runs as (10001), not root."""
    assert SERVICES[name]["user"] == "10001:10001"
    owned = dockerfile_owned_dirs()
    for _, target, _ in mounts(name):
        assert target in owned, f"{name}: {target} is not created owned by 10001 in deploy/Dockerfile"


# -- ports ------------------------------------------------------------------------------------------


def published(name: str) -> list[tuple[str, str]]:
    out = []
    for entry in SERVICES[name].get("ports") or []:
        host, container = str(entry).rsplit(":", 1)
        out.append((host, container))
    return out


def test_the_gateway_and_metrics_are_published_and_nothing_else():
    assert sorted(name for name in SERVICES if SERVICES[name].get("ports")) == ["gateway", "metrics"]
    gateway, metrics = env_of("gateway"), env_of("metrics")
    assert published("gateway") == [("8080", gateway["GPUSCHED_GATEWAY_PORT"])]
    assert gateway["GPUSCHED_GATEWAY_HOST"] == "0.0.0.0"
    assert published("metrics") == [("9100", metrics["GPUSCHED_METRICS_PORT"])]
    assert metrics["GPUSCHED_METRICS_HOST"] == "0.0.0.0"


def test_the_host_ports_can_be_moved():
    moved = compose({"GATEWAY_PORT": "18080", "METRICS_PORT": "19100"})["services"]
    assert moved["gateway"]["ports"] == ["18080:8080"] and moved["metrics"]["ports"] == ["19100:9100"]


@pytest.mark.parametrize("name,path", [("gateway", "/readyz"), ("metrics", "/healthz")])
def test_the_published_services_are_health_checked_on_their_own_port(name, path):
    port = published(name)[0][1]
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL") and any(f"http://127.0.0.1:{port}{path}" in part for part in test)


# -- secrets, the image, traces, Kafka ------------------------------------------------------------


def test_every_secret_is_a_file_under_deploy_secrets_that_no_image_can_contain():
    assert DOC["secrets"]
    for name, secret in DOC["secrets"].items():
        path = PurePosixPath(secret["file"])
        assert path.parent == PurePosixPath("deploy/secrets"), name
        assert not in_build_context(str(path)), f"{path} would be sent to docker build"
    assert (ROOT / "deploy" / "secrets" / ".gitignore").read_text().splitlines()[1:] == ["*", "!.gitignore"]


def test_the_make_secrets_script_writes_every_secret_compose_names():
    script = (ROOT / "deploy" / "make-secrets.sh").read_text()
    for secret in DOC["secrets"].values():
        assert f"write {PurePosixPath(secret['file']).name} " in script


def test_traces_go_to_the_collector_compose_runs():
    collector = SERVICES["otel-collector"]
    assert collector["image"].startswith("otel/opentelemetry-collector:")
    config_path = [c["target"] for c in collector["configs"]][0]
    assert f"--config={config_path}" in collector["command"]
    config = yaml.safe_load((ROOT / DOC["configs"]["otel-collector"]["file"]).read_text())
    http = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert "otlp" in config["service"]["pipelines"]["traces"]["receivers"]
    for name in gpusched_services():
        env = env_of(name)
        assert env["GPUSCHED_TRACE_EXPORTER"] == "otlp"
        endpoint = env["GPUSCHED_OTLP_ENDPOINT"]
        # the exporter is given the full URL: it adds no /v1/traces of its own
        assert endpoint == f"http://otel-collector:{http.rsplit(':', 1)[1]}/v1/traces", name


def test_kafka_is_the_version_the_suite_runs():
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{kafka.KAFKA_VERSION}"
    assert compose({"KAFKA_VERSION": "9.9.9"})["services"]["kafka"]["image"] == "apache/kafka:9.9.9"
    assert "ports" not in SERVICES["kafka"] and "ports" not in SERVICES["postgres"]
