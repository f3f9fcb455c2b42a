"""API tokens on a real PostgreSQL: issue, verify, refuse, revoke, list, the table's own CHECKs, and the
`gpusched tokens` commands end to end."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest

from gpusched_cli.main import main
from gpusched_common import tokens
from gpusched_common.db import connect
from gpusched_common.tokens import RefusalReason, TokenRefusal
from gpusched_core.access.principal import Principal, Role

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
HASH = "0" * 64


def secret_of(text: str) -> str:
    return text[len("gst_0123456789abcdef_"):]


@pytest.fixture
async def conn(database_url: str):
    connection = await connect(database_url)
    yield connection
    await connection.close()


async def issue(conn, role="user", tenant="research", name="ci", expires_at=None,
                now=T0) -> tuple[str, tokens.TokenInfo]:
    return await tokens.issue(conn, role=role, tenant=tenant, name=name, expires_at=expires_at,
                              created_by="test", now=now)


async def test_an_issued_token_verifies_as_its_principal_and_records_the_use(conn):
    text, info = await issue(conn)
    assert await tokens.verify(conn, text, T0 + timedelta(hours=1)) == Principal(
        subject=f"token:{info.token_id}:ci", role=Role.USER, tenant="research")
    [listed] = await tokens.list_tokens(conn)
    assert listed.last_used_at == T0 + timedelta(hours=1)
    assert await conn.fetchval("SELECT token_hash FROM api_tokens") == tokens.token_hash(text)


async def test_a_cluster_wide_token_verifies_without_a_tenant(conn):
    text, _ = await issue(conn, role="operator", tenant=None, name=None)
    principal = await tokens.verify(conn, text, T0)
    assert (principal.role, principal.tenant) == (Role.OPERATOR, None)


async def test_each_refusal_says_why(conn):
    text, info = await issue(conn)
    wrong_secret = text[:-1] + ("a" if text[-1] != "a" else "b")
    unknown_id = f"gst_{'e' * 16 if info.token_id == 'f' * 16 else 'f' * 16}_{secret_of(text)}"
    cases = {"gst_nope": RefusalReason.MALFORMED, wrong_secret: RefusalReason.UNKNOWN,
             unknown_id: RefusalReason.UNKNOWN}
    for token_text, reason in cases.items():
        assert await tokens.verify(conn, token_text, T0) == TokenRefusal(reason), token_text
    [listed] = await tokens.list_tokens(conn)
    assert listed.last_used_at is None  # no refused attempt counts as a use


async def test_an_expired_token_is_refused_from_its_expiry_on(conn):
    text, _ = await issue(conn, expires_at=T0 + timedelta(days=30))
    assert isinstance(await tokens.verify(conn, text, T0 + timedelta(days=30) - timedelta(seconds=1)), Principal)
    assert await tokens.verify(conn, text, T0 + timedelta(days=30)) == TokenRefusal(RefusalReason.EXPIRED)


async def test_revocation_is_effective_at_once_and_only_once(conn, database_url):
    text, info = await issue(conn)
    assert isinstance(await tokens.verify(conn, text, T0), Principal)
    other = await connect(database_url)  # the gateway's own connection
    try:
        assert await tokens.revoke(other, info.token_id, T0 + timedelta(minutes=1)) is True
        assert await tokens.revoke(other, info.token_id, T0 + timedelta(minutes=2)) is False
        assert await tokens.revoke(other, "f" * 15, T0) is False
    finally:
        await other.close()
    assert await tokens.verify(conn, text, T0 + timedelta(minutes=1)) == TokenRefusal(RefusalReason.REVOKED)
    [listed] = await tokens.list_tokens(conn)
    assert listed.revoked_at == T0 + timedelta(minutes=1)


async def test_a_wrong_secret_learns_nothing_of_a_revoked_token(conn):
    text, info = await issue(conn)
    await tokens.revoke(conn, info.token_id, T0)
    wrong_secret = text[:-1] + ("a" if text[-1] != "a" else "b")
    assert await tokens.verify(conn, wrong_secret, T0) == TokenRefusal(RefusalReason.UNKNOWN)


async def test_the_list_never_shows_a_hash_or_a_secret(conn):
    texts = [(await issue(conn, name=f"t{i}", now=T0 + timedelta(seconds=i)))[0] for i in range(2)]
    listed = await tokens.list_tokens(conn)
    assert [i.name for i in listed] == ["t0", "t1"]  # in the order they were issued
    shown = repr(listed)
    assert not any(t in shown or secret_of(t) in shown or tokens.token_hash(t) in shown for t in texts)


async def test_an_invalid_request_stores_nothing(conn):
    with pytest.raises(ValueError, match="bound to a tenant"):
        await issue(conn, tenant=None)
    with pytest.raises(ValueError, match="expire after"):
        await issue(conn, expires_at=T0)
    assert await tokens.list_tokens(conn) == []


async def insert(conn: asyncpg.Connection, role: str, tenant: str | None, token_hash: str = HASH) -> bool:
    """Try one api_tokens row written by hand, in a savepoint rolled back; True when PostgreSQL took it."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("INSERT INTO api_tokens (token_id, role, tenant, token_hash, created_at, created_by)"
                           " VALUES ('0123456789abcdef', $1, $2, $3, $4, 'hand')", role, tenant, token_hash, T0)
        return True
    except asyncpg.IntegrityConstraintViolationError:
        return False
    finally:
        await tx.rollback()


async def test_the_table_holds_the_binding_rule_even_for_rows_written_by_hand(conn):
    for role in Role:  # the CHECK's role list is the code's
        bound = role in tokens.TENANT_ROLES
        assert await insert(conn, role.value, "research" if bound else None) is True, role
        assert await insert(conn, role.value, None if bound else "research") is False, role
    assert await insert(conn, "admin", None) is False
    assert await insert(conn, "operator", None, token_hash="not-a-sha256") is False


def test_the_cli_creates_lists_and_revokes_tokens(database_url, monkeypatch, capsys):
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", database_url)
    assert main(["tokens", "create", "--tenant", "research", "--role", "user", "--name", "ci", "--expires", "30d",
                 "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["token"].startswith(f"gst_{created['token_id']}_")
    assert (created["role"], created["tenant"], created["name"]) == ("user", "research", "ci")
    assert created["expires_at"] is not None and "token_hash" not in created

    assert main(["tokens", "create", "--role", "operator"]) == 0
    out = capsys.readouterr().out
    assert "will not be shown again" in out
    operator_token = next(line for line in out.splitlines() if line.startswith("gst_"))

    assert main(["tokens", "list"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["ID", "NAME", "ROLE", "TENANT", "CREATED", "EXPIRES", "REVOKED",
                                             "LAST", "USED"]
    assert created["token_id"] in table and "research" in table and "operator" in table
    assert created["token"] not in table and operator_token not in table

    assert main(["tokens", "revoke", created["token_id"]]) == 0
    assert capsys.readouterr().out == f"revoked token {created['token_id']}\n"
    assert main(["tokens", "list", "--json"]) == 0
    listed = {t["token_id"]: t for t in json.loads(capsys.readouterr().out)}
    assert listed[created["token_id"]]["revoked_at"] is not None
    assert all("token" not in t and "token_hash" not in t for t in listed.values())

    assert main(["tokens", "revoke", created["token_id"]]) == 1  # already revoked
    assert "no unrevoked token" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["create", "--role", "user"], "role user is bound to a tenant"),
    (["create", "--role", "operator", "--tenant", "research"], "role operator is cluster-wide"),
    (["create", "--role", "root"], "unknown role 'root'"),
    (["create", "--role", "user", "--tenant", "research", "--expires", "soon"], "duration must be"),
    (["create", "--role", "user", "--tenant", "research", "--name", "my token"], "invalid token name"),
    (["revoke", "not an id"], "invalid token id"),
])
def test_bad_cli_input_exits_2_with_a_message_and_no_traceback(database_url, monkeypatch, capsys, argv, message):
    monkeypatch.setenv("GPUSCHED_DATABASE_URL", database_url)
    assert main(["tokens", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("gpusched tokens: ") and message in captured.err
    assert "Traceback" not in captured.err and captured.out == ""
