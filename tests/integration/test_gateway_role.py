"""The gateway's database role (migrations 017 and 032) on real PostgreSQL: it reads exactly the read models the
gateway serves and writes nothing but a token's last use; creating it again is a no-op; and the real app,
connected as it, answers every /v1 route (so the grants are complete; POST /v1/whatif reads only what 017
grants: no migration 035)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from gpusched_common import db_roles, tokens
from gpusched_common.db import MIGRATIONS_DIR, connect, drop_database, migrate
from gpusched_common.db_roles import GATEWAY_ROLE
from gpusched_core.access import Principal, Role
from gpusched_core.quota import load_tenancy
from gpusched_core.quota.jobs import QueuedJob
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from services.placement.store import queue_for_placement
from services.quota import store as quota_store
from tests.builders import T0, a_job
from tests.conftest import fresh_database
from tests.integration.test_gateway_api import ALLOWED_STATUS, bearer, expected, issue, request_path, routes, seed

MIGRATION = MIGRATIONS_DIR / "017_gateway_role.sql"
READ_ONLY = ("jobs", "events", "placement_pending", "quota_policy_pending", "quota_policy_usage",
             "quota_policy_history", "quota_tenancy_revisions", "nodes", "gpus", "gpu_allocations",
             "gpu_telemetry", "usage_samples", "cluster_utilization",  # these three: migration 032 (dashboard)
             "gpu_nominations", "quota_policy_reservations")  # these two: migration 033 (POST /v1/jobs:check)
GRANTED = (*READ_ONLY, "api_tokens")
# some of what it must never read: the outbox and inbox, admission's security state, quota's decisions
NEVER_READ = ("outbox", "inbox", "admission_auth_failure_counts", "admission_rate_buckets", "submission_requests",
              "quota_reclaims", "quota_tenancy_rejections", "schema_migrations")
TENANCY = """
version: 1
revision: 1
flavors: [H100-80GB]
tenants:
  - name: a
    quota: {H100-80GB: {nominal: 4}}
  - name: b
    quota: {H100-80GB: {nominal: 4}}
"""


@pytest.fixture
async def admin(database_url: str):
    conn = await connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture
async def role_url(database_url: str, admin: asyncpg.Connection) -> str:
    password = db_roles.new_password()
    await db_roles.enable_login(admin, GATEWAY_ROLE, password)
    return db_roles.role_url(database_url, GATEWAY_ROLE, password)


@pytest.fixture
async def gateway_conn(role_url: str):
    conn = await connect(role_url)
    yield conn
    await conn.close()


async def grants(admin: asyncpg.Connection) -> set[tuple[str, ...]]:
    """Every privilege the role holds on this database's relations and their columns."""
    tables = await admin.fetch(
        "SELECT c.relname, a.privilege_type FROM pg_class c, aclexplode(c.relacl) a"
        " WHERE a.grantee = $1::regrole AND c.relnamespace = 'public'::regnamespace", GATEWAY_ROLE)
    columns = await admin.fetch(
        "SELECT c.relname, t.attname, a.privilege_type FROM pg_attribute t JOIN pg_class c ON c.oid = t.attrelid,"
        " aclexplode(t.attacl) a WHERE a.grantee = $1::regrole AND c.relnamespace = 'public'::regnamespace",
        GATEWAY_ROLE)
    return {tuple(r) for r in tables} | {tuple(r) for r in columns}


async def refused(conn: asyncpg.Connection, sql: str, *args: object) -> bool:
    try:
        await conn.execute(sql, *args)
    except asyncpg.InsufficientPrivilegeError:
        return True
    return False


async def test_the_role_holds_select_on_its_read_models_and_update_of_last_used_at_only(admin, role_url):
    assert await grants(admin) == {(t, "SELECT") for t in GRANTED} | {("api_tokens", "last_used_at", "UPDATE")}
    role = await admin.fetchrow("SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls,"
                                " rolreplication FROM pg_roles WHERE rolname = $1", GATEWAY_ROLE)
    assert tuple(role) == (True, False, False, False, False, False)
    assert await admin.fetchval("SELECT has_database_privilege($1, current_database(), 'CONNECT')", GATEWAY_ROLE)
    assert await admin.fetchval("SELECT has_schema_privilege($1, 'public', 'USAGE')", GATEWAY_ROLE)
    assert not await admin.fetchval("SELECT has_schema_privilege($1, 'public', 'CREATE')", GATEWAY_ROLE)


async def test_it_reads_each_granted_table(gateway_conn):
    for table in GRANTED:
        await gateway_conn.fetch(f"SELECT * FROM {table} LIMIT 1")


async def test_it_inserts_updates_deletes_and_truncates_nothing(admin, gateway_conn):
    for table in GRANTED:
        column = await admin.fetchval("SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum = 1",
                                      table)
        for sql in (f"INSERT INTO {table} DEFAULT VALUES", f'UPDATE {table} SET "{column}" = "{column}"',
                    f"DELETE FROM {table}", f"TRUNCATE {table}"):
            assert await refused(gateway_conn, sql), sql


async def test_of_a_token_it_updates_last_used_at_and_no_other_column(admin, gateway_conn):
    text = await issue(admin, "operator", None)
    token_id = tokens.parse_token(text)
    assert await gateway_conn.execute(
        "UPDATE api_tokens SET last_used_at = $2 WHERE token_id = $1", token_id, T0) == "UPDATE 1"
    assert await admin.fetchval("SELECT last_used_at FROM api_tokens WHERE token_id = $1", token_id) == T0
    for column in ("revoked_at", "expires_at", "role", "tenant", "token_hash"):
        assert await refused(gateway_conn, f"UPDATE api_tokens SET {column} = NULL WHERE token_id = $1", token_id)
    assert isinstance(await tokens.verify(gateway_conn, text, T0), Principal)


async def test_it_reads_no_other_table(admin, gateway_conn):
    others = {r["tablename"] for r in await admin.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    others -= set(GRANTED)
    assert set(NEVER_READ) <= others
    for table in sorted(others):
        assert await refused(gateway_conn, f"SELECT * FROM {table} LIMIT 1"), table


async def test_creating_the_role_again_is_a_no_op(database_url, pg_server, admin):
    before = await grants(admin)
    assert await migrate(database_url) == []
    async with admin.transaction():  # the file itself, run again where the role and its grants exist
        await admin.execute(MIGRATION.read_text())
    assert await grants(admin) == before
    second = await fresh_database(pg_server, "gpusched_test")  # the role exists, from this test's database
    try:
        password = db_roles.new_password()
        await db_roles.enable_login(admin, GATEWAY_ROLE, password)
        conn = await connect(db_roles.role_url(second, GATEWAY_ROLE, password))
        try:
            assert await conn.fetchval("SELECT count(*) FROM jobs") == 0
            assert await refused(conn, "SELECT * FROM outbox")
        finally:
            await conn.close()
    finally:
        await drop_database(second)


async def test_a_password_is_quoted_never_run_and_only_known_roles_get_one(admin, database_url):
    await db_roles.enable_login(admin, GATEWAY_ROLE, "it's'; ALTER ROLE gpusched_gateway SUPERUSER; --")
    assert not await admin.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = $1", GATEWAY_ROLE)
    with pytest.raises(ValueError, match="unknown database role"):
        await db_roles.enable_login(admin, "postgres", db_roles.new_password())


def test_the_role_url_keeps_the_server_and_database_and_escapes_the_password():
    url = db_roles.role_url("postgresql://postgres:secret@db.example:5433/gpusched?sslmode=require",
                            GATEWAY_ROLE, "a/b@c:d%e")
    assert url == "postgresql://gpusched_gateway:a%2Fb%40c%3Ad%25e@db.example:5433/gpusched?sslmode=require"
    assert db_roles.role_url("postgresql://postgres@127.0.0.1:5432/x", GATEWAY_ROLE, "p") == (
        "postgresql://gpusched_gateway:p@127.0.0.1:5432/x")
    assert len(db_roles.new_password()) >= 43 and db_roles.new_password() != db_roles.new_password()


async def seed_queues(conn: asyncpg.Connection) -> None:
    """A tenancy in force, a job waiting for quota and one for placement: the queue reads every table."""
    await quota_store.install(conn, load_tenancy(TENANCY), TENANCY, source="test", event_id=None, now=T0)
    await quota_store.queue_job(conn, QueuedJob("a-01", "a", 1, None, 0, T0.timestamp()))
    await queue_for_placement(conn, "b-01", a_job("b-01").tenant("b").spec())


async def seed_dashboard(conn: asyncpg.Connection) -> None:
    """What the metrics service writes for the dashboard (migration 032): a reading of n1's GPU 0, a usage
    sample of tenant a and its cycle's utilisation sample; a job placed a minute ago (the history's waits)."""
    now = datetime.now(UTC)
    await conn.execute("INSERT INTO gpu_telemetry VALUES ('n1', 0, 42.0, 1024, true, $1)", now)
    await conn.execute("INSERT INTO usage_samples VALUES ($1, 'a', 'H100-80GB', 1.0, 1.0, 42.0)", now)
    await conn.execute("INSERT INTO cluster_utilization VALUES ($1, 1, 1, 0.42)", now)
    await conn.execute("UPDATE jobs SET submitted_at = $1::timestamptz, placed_at = $1::timestamptz + interval '5 seconds' WHERE job_id = 'a-02'",
                       now - timedelta(minutes=1))


async def test_the_gateway_as_its_role_answers_every_route(database_url, admin, role_url):
    await seed(admin)
    await seed_queues(admin)
    await seed_dashboard(admin)
    names = {"operator": await issue(admin, "operator", None), "user": await issue(admin, "user", "a")}
    app = create_app(GatewaySettings(database_url=database_url, gateway_database_url=role_url))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            assert (await client.get("/readyz")).status_code == 200
            for path, action in routes():
                url, params = request_path(path, own=True)
                for name, role in (("operator", Role.OPERATOR), ("user", Role.USER)):
                    response = await client.get(url, headers=bearer(names[name]), params=params)
                    want = ALLOWED_STATUS.get(path, 200) if role is Role.OPERATOR else expected(role, action, own=True)
                    assert response.status_code == want, (path, name, response.text)
            queue = (await client.get("/v1/queue", headers=bearer(names["operator"]))).json()["jobs"]
            cluster = (await client.get("/v1/cluster", headers=bearer(names["operator"]))).json()
            history = (await client.get("/v1/history", headers=bearer(names["user"]))).json()
            # the one POST route that reads (the others publish, or are check's: test_gateway_check.py)
            replayed = await client.post("/v1/whatif", json={"since": "3650d"}, headers=bearer(names["operator"]))
            assert replayed.status_code == 200 and replayed.json()["left_out"] > 0, replayed.text
    assert cluster["nodes"][0]["gpus"][0]["utilization_pct"] == 42.0
    assert [s["tenant"] for s in history["series"]] == ["a"] and history["series"][0]["points"][-1][1] == 1.0
    assert [(w["tenant"], w["count"], w["p50_s"]) for w in history["waits"]] == [("a", 1, 5.0)]
    assert {j["job_id"]: j["queue"] for j in queue if j["job_id"] in ("a-01", "b-01")} == {
        "a-01": "quota/a", "b-01": "capacity"}
    used = await admin.fetchval("SELECT count(*) FROM api_tokens WHERE last_used_at IS NOT NULL")
    assert used == 2  # verify recorded each token's use, as the role
