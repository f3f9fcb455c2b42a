"""`gpusched tokens`: operators issue, list and revoke the API tokens of the gateway.

    gpusched tokens create --role R [--tenant T] [--name N] [--expires 30d] [--json]   # shows the token once
    gpusched tokens list [--json]                       # never a token's secret or hash
    gpusched tokens revoke TOKEN_ID                     # refused by the next request that carries it

`user` and `tenant-admin` tokens are bound to a tenant; `viewer` and `operator` tokens to none.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime, timezone
from typing import TypeVar

import asyncpg

from gpusched_cli.operator_settings import operator_settings as _settings
from gpusched_common import tokens
from gpusched_common.db import connect
from gpusched_common.ids import is_valid_id
from gpusched_common.table import render

T = TypeVar("T")


def add_tokens_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("tokens", help="API tokens for the gateway: create, list, revoke (operators)")
    sub = p.add_subparsers(dest="tokens_cmd", required=True)
    create = sub.add_parser("create", help="issue a token; it is shown once and stored only as a hash")
    create.add_argument("--role", required=True, help="user, tenant-admin, viewer or operator")
    create.add_argument("--tenant", help="the tenant a user or tenant-admin token is bound to")
    create.add_argument("--name", help="what the token is for, e.g. ci-research")
    create.add_argument("--expires", metavar="DURATION", help="e.g. 30d, 12h, 90m (default: never)")
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_create)
    listing = sub.add_parser("list", help="every token: role, tenant, expiry, revocation, last use")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    revoke = sub.add_parser("revoke", help="revoke a token, effective at once")
    revoke.add_argument("token_id")
    revoke.set_defaults(func=cmd_revoke)
    return p


def with_conn(work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    async def go() -> T:
        conn = await connect(_settings().database_url)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def _fail(message: object, code: int) -> int:
    print(f"gpusched tokens: {message}", file=sys.stderr)
    return code


def issuer() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no login name in this environment
        return "cli"


def _json_info(info: tokens.TokenInfo) -> dict[str, object]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(info).items()}


def when(at: datetime | None) -> str | None:
    return None if at is None else at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M")


def cmd_create(args: argparse.Namespace) -> int:
    now = datetime.now(timezone.utc)
    try:
        tokens.checked_role(args.role, args.tenant, args.name)  # before connecting: bad input needs no database
        expires_at = now + tokens.parse_duration(args.expires) if args.expires else None
        text, info = with_conn(lambda conn: tokens.issue(
            conn, role=args.role, tenant=args.tenant, name=args.name, expires_at=expires_at,
            created_by=issuer(), now=now))
    except ValueError as exc:
        return _fail(exc, 2)
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if args.json:
        print(json.dumps({"token": text, **_json_info(info)}, indent=2))
        return 0
    bound = f" of tenant {info.tenant}" if info.tenant else ""
    expiry = f"expires {when(info.expires_at)} UTC" if info.expires_at else "never expires"
    print(f"token {info.token_id} ({info.role}{bound}), {expiry}:")
    print(text)
    print("This token will not be shown again: only its hash is stored. Keep it secret.")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    try:
        found = with_conn(tokens.list_tokens)
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if args.json:
        print(json.dumps([_json_info(i) for i in found], indent=2))
        return 0
    rows = [(i.token_id, i.name, i.role, i.tenant, when(i.created_at), when(i.expires_at), when(i.revoked_at),
             when(i.last_used_at)) for i in found]
    print(render(["ID", "NAME", "ROLE", "TENANT", "CREATED", "EXPIRES", "REVOKED", "LAST USED"], rows))
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    if not is_valid_id(args.token_id):
        return _fail(f"invalid token id {args.token_id!r}", 2)
    try:
        revoked = with_conn(lambda conn: tokens.revoke(conn, args.token_id, datetime.now(timezone.utc)))
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if not revoked:
        return _fail(f"no unrevoked token {args.token_id} (see `gpusched tokens list`)", 1)
    print(f"revoked token {args.token_id}")
    return 0
