"""PostgreSQL connections and schema migrations."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg

MIGRATIONS_DIR = Path(__file__).resolve().parents[3] / "deploy" / "migrations"
_MIGRATION_LOCK = 727_001  # advisory lock id: one migrator at a time

# What a loop that reads the store meets while PostgreSQL is away or restarting (refused or broken
# connections, "the database system is starting up", a connection ended mid-query): it waits and retries.
DATABASE_AWAY: tuple[type[BaseException], ...] = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(database_url: str, *, min_size: int = 1, max_size: int = 5) -> asyncpg.Pool:
    return await asyncpg.create_pool(database_url, min_size=min_size, max_size=max_size, init=_init_connection)


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
