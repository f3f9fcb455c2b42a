"""Helpers shared by the deploy tests (test_deploy_*.py): the files they read, the compose
specification's published schema, compose's variable interpolation, the settings classes of each process,
and Docker's .dockerignore matching. Nothing here runs Docker or Kubernetes."""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from functools import cache
from pathlib import Path

import yaml

from gpusched_common.settings import Settings
from services.admission.settings import AdmissionSettings
from services.gateway.settings import GatewaySettings
from services.metrics.settings import MetricsSettings
from services.node_agent.settings import AgentSettings
from services.placement.settings import PlacementSettings
from services.preemption.settings import PreemptionSettings
from services.quota.settings import QuotaSettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ENTRYPOINT = ROOT / "deploy" / "docker-entrypoint.sh"
KUBERNETES_DIR = ROOT / "deploy" / "kubernetes"

# The compose specification's JSON schema (compose-spec/compose-spec, schema/compose-spec.json), as
# vendored by check-jsonschema (python-jsonschema/check-jsonschema) 0.39.0, pinned in constraints.txt.
COMPOSE_SCHEMA_PACKAGE = "check_jsonschema.builtin_schemas.vendor"
COMPOSE_SCHEMA_FILE = "compose-spec.json"
COMPOSE_SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"

# Each gpusched process's settings class, by the module it runs (`python -m services.X`); the one-shot
# commands (`gpusched migrate`, `create-topics`, `gateway-init`) read the shared settings.
SETTINGS_BY_MODULE: dict[str, type[Settings]] = {
    "services.admission": AdmissionSettings,
    "services.quota": QuotaSettings,
    "services.placement": PlacementSettings,
    "services.preemption": PreemptionSettings,
    "services.metrics": MetricsSettings,
    "services.gateway": GatewaySettings,
    "services.node_agent": AgentSettings,
}
CONTROL_PLANE = ("services.admission", "services.quota", "services.placement", "services.preemption",
                 "services.metrics")
AGENT = "services.node_agent"
GATEWAY = "services.gateway"


def compose_text() -> str:
    return COMPOSE_FILE.read_text()


@cache
def compose_schema_bytes() -> bytes:
    return (importlib.resources.files(COMPOSE_SCHEMA_PACKAGE) / COMPOSE_SCHEMA_FILE).read_bytes()


def compose_schema() -> dict:
    return json.loads(compose_schema_bytes())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_VARIABLE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value: object, env: dict[str, str]) -> object:
    """``value`` with compose's variable interpolation done, as `docker compose config` would with
    ``env`` as the shell: ``${X}``, ``$X``, ``${X:-default}``, ``${X-default}``, ``${X:?error}``,
    ``${X?error}``; ``$$`` is a literal ``$``. A required variable that is unset raises KeyError."""
    if isinstance(value, dict):
        return {interpolate(k, env): interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        operator, word = match.group(2), match.group(3) or ""
        given = env.get(name)
        empty = given is None or (operator is not None and operator.startswith(":") and given == "")
        if operator in (":-", "-"):
            return word if empty else given
        if operator in (":?", "?"):
            if empty:
                raise KeyError(f"{name}: {word}")
            return given
        return given or ""

    return _VARIABLE.sub(one, value)


def compose(env: dict[str, str] | None = None) -> dict:
    """docker-compose.yml as compose sees it: YAML anchors and merge keys resolved, then interpolated."""
    return interpolate(yaml.safe_load(compose_text()), env or {})


def module_of(command: object) -> str | None:
    """The module of ``python -m services.X`` (None for any other command, e.g. a shell script)."""
    if isinstance(command, list) and command[:2] == ["python", "-m"] and len(command) > 2:
        return command[2]
    return None


def entrypoint_file_settings() -> list[str]:
    """The settings the image's entrypoint reads from a NAME_FILE (deploy/docker-entrypoint.sh)."""
    found = re.search(r"^for name in ([A-Z_ ]+); do$", ENTRYPOINT.read_text(), re.M)
    assert found, "the entrypoint's list of NAME_FILE settings"
    return found.group(1).split()


def setting_names(cls: type[Settings]) -> set[str]:
    """The environment variables ``cls`` reads (prefix GPUSCHED_), and the entrypoint's NAME_FILE ones."""
    names = {f"GPUSCHED_{field.upper()}" for field in cls.model_fields}
    return names | {f"{name}_FILE" for name in entrypoint_file_settings() if name in names}


def _ignore_regex(pattern: str) -> re.Pattern:
    """One .dockerignore pattern as a regular expression over a slash-separated relative path (Go's
    filepath.Match, with `**` for any number of directories, as Docker's patternmatcher does)."""
    pattern = pattern.strip("/")
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, _ignore_regex(line[1:] if negated else line)))
    return rules


def in_build_context(path: str) -> bool:
    """Whether ``path`` (relative to the repository) is sent to `docker build .`: the last pattern that
    matches it or one of its parent directories decides, as in Docker."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in dockerignore_rules():
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not negated
    return not excluded


def yaml_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
