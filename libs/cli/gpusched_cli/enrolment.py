"""`gpusched join-token` and `gpusched node-keys`: operators let nodes in and keep track of who they are
(``gpusched_common.node_keys``).

    gpusched join-token create [--ttl 24h | --ttl never] [--description D] [--file PATH] [--json]
    gpusched join-token list [--json]
    gpusched join-token revoke TOKEN_ID        # nodes enrolled with it keep their keys
    gpusched node-keys list [--json]           # every node's key: when enrolled, with which token, revoked
    gpusched node-keys revoke NODE             # its reports are refused until it enrols again
    gpusched node-keys refused [--json]        # messages receivers refused: unsigned, unknown, forged, stale

A node given a join token (``GPUSCHED_AGENT_JOIN_TOKEN_FILE``) makes its own key and enrols it; the token is
shown once and only its public half is stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import asyncpg

from gpusched_cli.tokens import issuer, when, with_conn
from gpusched_common import node_keys, senders, tokens
from gpusched_common.ids import is_valid_id
from gpusched_common.files import write_private
from gpusched_common.table import render


def add_enrolment_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("join-token", help="join tokens nodes enrol their own keys with: create, list, revoke")
    sub = p.add_subparsers(dest="join_token_cmd", required=True)
    create = sub.add_parser("create", help="a token to give new nodes; shown once, only its public half is kept")
    create.add_argument("--ttl", default="24h", help="how long it lets nodes in: 24h, 7d, ... or never (default 24h)")
    create.add_argument("--description", default="", help="what it is for, e.g. rack-12 expansion")
    create.add_argument("--file", type=Path, help="write it to this file (mode 0600) instead of printing it")
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_token_create)
    listing = sub.add_parser("list", help="every token: expiry, revocation, nodes enrolled with it")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_token_list)
    revoke = sub.add_parser("revoke", help="let no more nodes in with a token")
    revoke.add_argument("token_id")
    revoke.set_defaults(func=cmd_token_revoke)

    p = subparsers.add_parser("node-keys", help="nodes' own keys: list, revoke; messages refused")
    sub = p.add_subparsers(dest="node_keys_cmd", required=True)
    listing = sub.add_parser("list", help="every node key: node, when and with which token enrolled, revoked")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_keys_list)
    revoke = sub.add_parser("revoke", help="revoke a node's key: its reports are refused until it enrols again")
    revoke.add_argument("node_id", metavar="NODE")
    revoke.set_defaults(func=cmd_keys_revoke)
    refused = sub.add_parser("refused", help="messages receivers refused, by topic, reason and signer")
    refused.add_argument("--json", action="store_true")
    refused.set_defaults(func=cmd_refused)


def _fail(what: str, message: object, code: int) -> int:
    print(f"gpusched {what}: {message}", file=sys.stderr)
    return code


def _plain(record: object) -> dict[str, object]:
    out = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(record).items()}  # type: ignore[arg-type]
    out.pop("public_key", None)
    return out


def cmd_token_create(args: argparse.Namespace) -> int:
    try:
        ttl = None if args.ttl == "never" else tokens.parse_duration(args.ttl)
        text, record = with_conn(lambda conn: node_keys.create_token(
            conn, description=args.description, ttl=ttl, created_by=issuer(), now=datetime.now(timezone.utc)))
    except ValueError as exc:
        return _fail("join-token", exc, 2)
    except asyncpg.PostgresError as exc:
        return _fail("join-token", f"database: {exc}", 1)
    if args.file is not None:
        try:
            write_private(args.file, text + "\n")
        except OSError as exc:
            return _fail("join-token", f"cannot write {str(args.file)!r}: {exc.strerror}", 1)
    expiry = f"until {when(record.expires_at)} UTC" if record.expires_at else "with no expiry"
    if args.json:
        print(json.dumps({**_plain(record), **({"file": str(args.file)} if args.file else {"token": text})}, indent=2))
    elif args.file is not None:
        print(f"join token {record.token_id} ({expiry}) written to {args.file}")
    else:
        print(f"join token {record.token_id}, valid {expiry}:")
        print(text)
        print("It is shown once: only its public half is stored. Give it to new nodes "
              "(GPUSCHED_AGENT_JOIN_TOKEN_FILE); each makes its own key and enrols it.")
    return 0


def cmd_token_list(args: argparse.Namespace) -> int:
    try:
        found = with_conn(node_keys.list_tokens)
    except asyncpg.PostgresError as exc:
        return _fail("join-token", f"database: {exc}", 1)
    if args.json:
        print(json.dumps([_plain(t) for t in found], indent=2))
        return 0
    rows = [(t.token_id, t.description, when(t.created_at), t.created_by, when(t.expires_at) or "never",
             when(t.revoked_at), t.enrolled) for t in found]
    print(render(["ID", "DESCRIPTION", "CREATED", "BY", "EXPIRES", "REVOKED", "NODES"], rows))
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    if not (len(args.token_id) == 16 and all(c in "0123456789abcdef" for c in args.token_id)):
        return _fail("join-token", f"invalid token id {args.token_id[:40]!r} (16 hex digits, see `gpusched join-token "
                                   "list`)", 2)
    try:
        done = with_conn(lambda conn: node_keys.revoke_token(conn, args.token_id, datetime.now(timezone.utc)))
    except asyncpg.PostgresError as exc:
        return _fail("join-token", f"database: {exc}", 1)
    if not done:
        return _fail("join-token", f"no unrevoked join token {args.token_id}", 1)
    print(f"revoked join token {args.token_id}: it lets no more nodes in (nodes enrolled with it keep their keys)")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    try:
        found = with_conn(node_keys.list_keys)
    except asyncpg.PostgresError as exc:
        return _fail("node-keys", f"database: {exc}", 1)
    if args.json:
        print(json.dumps([_plain(k) for k in found], indent=2))
        return 0
    rows = [(k.node_id, k.key_id, when(k.enrolled_at), k.token_id, when(k.revoked_at), k.revoked_by) for k in found]
    print(render(["NODE", "KEY", "ENROLLED", "TOKEN", "REVOKED", "BY"], rows))
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    if not is_valid_id(args.node_id):
        return _fail("node-keys", f"invalid node id {args.node_id[:40]!r}", 2)

    async def revoke(conn: asyncpg.Connection) -> list[str]:
        async with conn.transaction():
            return await node_keys.revoke_node(conn, args.node_id, issuer(), datetime.now(timezone.utc))

    try:
        revoked = with_conn(revoke)
    except asyncpg.PostgresError as exc:
        return _fail("node-keys", f"database: {exc}", 1)
    if not revoked:
        return _fail("node-keys", f"node {args.node_id} has no live key (see `gpusched node-keys list`)", 1)
    print(f"revoked key {', '.join(revoked)} of node {args.node_id}: its reports are refused from now on (within "
          f"{node_keys.DEFAULT_CACHE_TTL_S:.0f} s); its lease lapses and its jobs are requeued. It may enrol again "
          "with a join token.")
    return 0


def cmd_refused(args: argparse.Namespace) -> int:
    try:
        rows = with_conn(senders.refusal_counts)
    except asyncpg.PostgresError as exc:
        return _fail("node-keys", f"database: {exc}", 1)
    found = [dict(r) for r in rows]
    if args.json:
        print(json.dumps([{k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in r.items()} for r in found],
                         indent=2))
        return 0
    print(render(["RECEIVER", "TOPIC", "REASON", "SIGNER", "REFUSED", "LAST", "LATEST"],
                 [(r["receiver"], r["topic"], r["reason"], r["sender"], r["refused"], when(r["last_at"]),
                   r["last_detail"][:80]) for r in found]))
    return 0
