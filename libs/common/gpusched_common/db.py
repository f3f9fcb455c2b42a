"""PostgreSQL connections and schema migrations."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "deploy" / "migrations"
_MIGRATION_LOCK = 727_001  # advisory lock id: one migrator at a time

# What a loop that reads the store meets while PostgreSQL is away or restarting (refused or broken
# connections, "the database system is starting up", a connection ended mid-query): it waits and retries.
# A connection the server ended mid-operation can also leave asyncpg's protocol in a state it reports as an
# InternalClientError ("cannot switch to state 12; another operation (2) is in progress"; seen when a test
# made the database refuse connections and terminated its sessions): the same wait and retry.
DATABASE_AWAY: tuple[type[BaseException], ...] = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
                                                  asyncpg.InternalClientError)


# A background repair pass (recovery from the store) yields to the live path: it waits at most this long
# for a row lock a consumer's batch holds, then gives up its own work and tries again at its next pass. Well
# under PostgreSQL's deadlock_timeout (1 s), so a repair and a batch that lock the same new rows in
# opposite orders never deadlock: the repair always steps back first.
YIELD_LOCK_TIMEOUT_MS = 200


@asynccontextmanager
async def yielding_to_live_work(conn: asyncpg.Connection, lock_timeout_ms: int = YIELD_LOCK_TIMEOUT_MS,
                                ) -> AsyncIterator[None]:
    """A savepoint in the caller's transaction whose statements wait at most ``lock_timeout_ms`` for a lock;
    past that its work is rolled back and ``asyncpg.LockNotAvailableError`` raised (the caller's transaction
    goes on). The caller's own lock timeout is restored after it."""
    previous = await conn.fetchval("SELECT current_setting('lock_timeout')")
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = {int(lock_timeout_ms)}")
        yield
    await conn.execute("SELECT set_config('lock_timeout', $1, true)", previous)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


# Server pids of pooled connections that took session state (a session-level advisory lock, a LISTEN): only
# these get the full reset when they go back to the pool (``_reset_connection``).
_SESSION_STATE: set[int] = set()


def keeps_session_state(conn: asyncpg.Connection) -> None:
    """Mark a pooled connection that takes session state, for the full reset when it goes back to the pool."""
    _SESSION_STATE.add(conn.get_server_pid())


async def _reset_connection(conn: asyncpg.Connection) -> None:
    """What the pool does to a connection it takes back, after asyncpg itself ended any transaction left open:
    the full reset (session advisory locks, LISTEN, settings, cursors) only where ``keeps_session_state`` said
    so. Everything else keeps no session state (``SET LOCAL``, transaction-level advisory locks), and asyncpg's
    default reset is one more round trip on every release: a few per job in each service."""
    pid = conn.get_server_pid()
    if pid in _SESSION_STATE:
        _SESSION_STATE.discard(pid)
        query = conn.get_reset_query()
        if query:
            await conn.execute(query)


async def create_pool(database_url: str, *, min_size: int = 1, max_size: int = 5) -> asyncpg.Pool:
    return await asyncpg.create_pool(database_url, min_size=min_size, max_size=max_size, init=_init_connection,
                                     reset=_reset_connection)


async def connect(database_url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(database_url)
    await _init_connection(conn)
    return conn


async def migrate(database_url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply every migration file not yet applied, in name order; returns the names applied."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        applied = []
        for path in sorted(directory.glob("*.sql")):
            if path.name in done:
                continue
            async with conn.transaction():
                await conn.execute(path.read_text())
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", path.name)
            applied.append(path.name)
        return applied
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK)
        await conn.close()


async def ensure_database(database_url: str) -> bool:
    """Create the database named in the URL if it does not exist; True when it was created."""
    base, _, name = database_url.rpartition("/")
    name = name.split("?")[0]
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if exists:
            return False
        await admin.execute(f'CREATE DATABASE "{name}"')
        return True
    finally:
        await admin.close()


async def drop_database(database_url: str) -> None:
    base, _, name = database_url.rpartition("/")
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
