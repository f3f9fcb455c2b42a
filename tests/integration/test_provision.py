"""`gpusched gateway-init` on real PostgreSQL: the gateway's producer is created once and kept on every
later run (its key file mode 0600), replaced by a new key once revoked; the role password file lets the
gateway's role log in with that password; bad input exits 2 and an unreachable database 1, never with a
traceback."""

from __future__ import annotations

import argparse
import asyncio
import json
import stat
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest
from gpusched_cli.provision import cmd_gateway_init
from gpusched_common import db_roles, producers
from gpusched_common.db_roles import GATEWAY_ROLE


def gateway_init(key_file: Path, password_file: Path | None = None, as_json: bool = True,
                 public_key_file: Path | None = None) -> int:
    return cmd_gateway_init(argparse.Namespace(producer_key_file=key_file, role_password_file=password_file,
                                               json=as_json, public_key_file=public_key_file))


def run_json(capsys: pytest.CaptureFixture[str], key_file: Path, password_file: Path | None = None) -> dict:
    assert gateway_init(key_file, password_file) == 0
    return json.loads(capsys.readouterr().out)


def query(database_url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    async def go() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(database_url)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(go())


def revoke(database_url: str, producer_id: str) -> bool:
    async def go() -> bool:
        conn = await asyncpg.connect(database_url)
        try:
            return await producers.revoke(conn, producer_id, datetime.now(UTC))
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.fixture
def operator_env(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", database_url)
    return database_url


def test_the_gateway_producer_is_created_once_and_kept_on_every_later_run(operator_env, tmp_path, capsys):
    key_file = tmp_path / "secrets" / "gateway-producer.key"
    first = run_json(capsys, key_file)
    second = run_json(capsys, key_file)

    assert first["producer"]["created"] is True and second["producer"]["created"] is False
    assert second["producer"]["producer_id"] == first["producer"]["producer_id"]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = producers.read_key_file(key_file)
    assert key is not None and key.producer_id == first["producer"]["producer_id"]
    rows = query(operator_env, "SELECT producer_id, name, tenants, attests, revoked_at FROM producers")
    assert [tuple(r) for r in rows] == [(key.producer_id, "gateway", ["*"], True, None)]
    assert first["role"] is None


def test_a_revoked_gateway_producer_is_replaced_by_a_new_key(operator_env, tmp_path, capsys):
    key_file = tmp_path / "gateway-producer.key"
    old_id = run_json(capsys, key_file)["producer"]["producer_id"]
    old_text = key_file.read_text()
    assert revoke(operator_env, old_id)

    again = run_json(capsys, key_file)

    assert again["producer"]["created"] is True and again["producer"]["producer_id"] != old_id
    assert key_file.read_text() != old_text and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    rows = query(operator_env, "SELECT producer_id, name, revoked_at IS NOT NULL AS revoked FROM producers")
    by_id = {r["producer_id"]: (r["name"], r["revoked"]) for r in rows}
    assert by_id == {old_id: (f"gateway.{old_id}", True), again["producer"]["producer_id"]: ("gateway", False)}


def test_the_role_password_file_lets_the_gateway_role_log_in_with_that_password(operator_env, tmp_path, capsys):
    query(operator_env, f"ALTER ROLE {GATEWAY_ROLE} NOLOGIN")  # as migration 017 leaves it
    password = db_roles.new_password()
    password_file = tmp_path / "gateway-db-password"
    password_file.write_text(password + "\n")  # the trailing newline is not part of the password

    done = run_json(capsys, tmp_path / "gateway-producer.key", password_file)

    assert done["role"] == {"role": GATEWAY_ROLE, "login_enabled": True}
    [row] = query(operator_env, "SELECT rolcanlogin FROM pg_roles WHERE rolname = $1", GATEWAY_ROLE)
    assert row["rolcanlogin"] is True
    [who] = query(db_roles.role_url(operator_env, GATEWAY_ROLE, password), "SELECT current_user AS name")
    assert who["name"] == GATEWAY_ROLE


def test_the_text_output_says_what_was_done_one_line_each(operator_env, tmp_path, capsys):
    key_file, password_file = tmp_path / "gateway-producer.key", tmp_path / "pw"
    password_file.write_text(db_roles.new_password())
    assert gateway_init(key_file, password_file, as_json=False) == 0
    created = capsys.readouterr().out.splitlines()
    assert gateway_init(key_file, None, as_json=False) == 0
    kept = capsys.readouterr().out.splitlines()

    assert len(created) == 3 and created[0].startswith("producer gateway: created ")
    assert created[1].startswith(f"database role {GATEWAY_ROLE}: login enabled")
    assert created[2].startswith("agents serve jobs' logs to the gateway with GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY=")
    assert len(kept) == 2 and kept[0].startswith("producer gateway: kept ") and kept[1] == created[2]
    assert password_file.read_text() not in "\n".join(created)


@pytest.mark.parametrize(("case", "message"), [
    ("missing password file", "cannot read the role password file"),
    ("empty password file", "is empty"),
    ("key file is a directory", "is a directory"),
])
def test_bad_input_exits_2_with_a_message_and_no_traceback(operator_env, tmp_path, capsys, case, message):
    key_file, password_file = tmp_path / "gateway-producer.key", tmp_path / "pw"
    if case == "empty password file":
        password_file.write_text(" \n")
    if case == "key file is a directory":
        key_file.mkdir()
        password_file = None

    assert gateway_init(key_file, password_file) == 2

    captured = capsys.readouterr()
    assert captured.err.startswith("gpusched gateway-init: ") and message in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert query(operator_env, "SELECT 1 FROM producers") == []


@pytest.mark.parametrize("where", ["unreachable server", "no such database"])
def test_a_database_that_cannot_be_used_exits_1_with_a_message(database_url, monkeypatch, tmp_path, capsys, where):
    url = "postgresql://gpusched@127.0.0.1:1/gpusched" if where == "unreachable server" \
        else database_url.rpartition("/")[0] + "/gpusched_no_such_database"
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", url)

    assert gateway_init(tmp_path / "gateway-producer.key") == 1

    captured = capsys.readouterr()
    assert captured.err.startswith("gpusched gateway-init: database: ") and "Traceback" not in captured.err
    assert not (tmp_path / "gateway-producer.key").exists()


def test_the_public_key_file_holds_what_agents_check_log_requests_against(operator_env, tmp_path, capsys,
                                                                          monkeypatch):
    from services.node_agent.settings import AgentSettings

    key_file, public_file = tmp_path / "secrets" / "gateway-producer.key", tmp_path / "public" / "gateway.pub"
    public_file.parent.mkdir()
    assert gateway_init(key_file, public_key_file=public_file) == 0
    done = json.loads(capsys.readouterr().out)
    assert public_file.read_text() == done["producer"]["public_key"] + "\n"
    assert stat.S_IMODE(public_file.stat().st_mode) == 0o644
    monkeypatch.setenv("GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE", str(public_file))
    assert AgentSettings().gateway_public_key() == done["producer"]["public_key"]
    monkeypatch.setenv("GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE", str(tmp_path / "missing.pub"))
    with pytest.raises(RuntimeError, match="cannot be read"):
        AgentSettings().gateway_public_key()
