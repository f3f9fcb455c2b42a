"""Login for the services' own database roles, which the migrations create NOLOGIN (``017_gateway_role``:
the gateway's): a password is a deployment's secret, never a migration's."""

from __future__ import annotations

import secrets
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

GATEWAY_ROLE = "gpusched_gateway"
KNOWN_ROLES = frozenset({GATEWAY_ROLE})


def new_password() -> str:
    """A random password from the system's secure source (43 urlsafe characters)."""
    return secrets.token_urlsafe(32)


async def enable_login(conn: asyncpg.Connection, role: str, password: str) -> None:
    """Let ``role`` (one of ``KNOWN_ROLES``) log in with ``password``; the caller may alter roles."""
    if role not in KNOWN_ROLES:
        raise ValueError(f"unknown database role {role!r}; one of {', '.join(sorted(KNOWN_ROLES))}")
    # ALTER ROLE takes no bind parameters: the server quotes both (format %I, %L), not Python
    statement = await conn.fetchval("SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', $1::text, $2::text)",
                                    role, password)
    await conn.execute(statement)


def role_url(database_url: str, role: str, password: str) -> str:
    """``database_url``'s server and database (and query), as ``role`` with ``password``."""
    parts = urlsplit(database_url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(role, safe='')}:{quote(password, safe='')}@{host}"))
