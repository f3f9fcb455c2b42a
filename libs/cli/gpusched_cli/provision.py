"""`gpusched gateway-init`: provision what the gateway needs before it starts (the compose stack's `init`
runs it after `gpusched migrate`; idempotent, so safe on every start).

    gpusched gateway-init --producer-key-file PATH [--role-password-file PATH] [--public-key-file PATH] [--json]

- the gateway's producer (`producers.ensure`: name `gateway`, any tenant, attesting its callers): kept
  while PATH holds its valid, unrevoked key; else created, its key written to PATH (mode 0600);
- with `--role-password-file`, the gateway's database role (`gpusched_gateway`, migration 017, NOLOGIN)
  may log in with the password that file holds (set again on every run: changing the file rotates it);
- with `--public-key-file`, the producer's public key is written there (mode 0644): what node agents check
  the gateway's log requests against (GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY_FILE); it holds no secret.

Connects with the operator's database URL (GPUSCHED_DATABASE_URL), which may create producers and alter roles.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from gpusched_common import db_roles, producers
from gpusched_common.db_roles import GATEWAY_ROLE
from gpusched_common.files import write_public
from gpusched_common.identity import OPERATOR
from gpusched_common import senders

from gpusched_cli.tokens import issuer, with_conn

GATEWAY_PRODUCER = "gateway"


@dataclass(frozen=True)
class Provisioned:
    producer_id: str
    producer_created: bool
    login_enabled: bool
    public_key: str = ""  # the gateway producer's public key: what agents check log requests against


def add_provision_parsers(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gateway-init", help="provision the gateway's producer key and database login "
                                                   "(idempotent; operators, the stack's init)")
    p.add_argument("--producer-key-file", required=True, type=Path, metavar="PATH",
                   help="where the gateway's producer key is kept (written, mode 0600, when it holds no valid key)")
    p.add_argument("--role-password-file", type=Path, metavar="PATH",
                   help=f"a file holding the password the {GATEWAY_ROLE} database role logs in with")
    p.add_argument("--public-key-file", type=Path, metavar="PATH",
                   help="also write the gateway's public key here, for node agents (no secret)")
    p.add_argument("--service-keys-dir", type=Path, metavar="DIR",
                   help="keep placement's and preemption's signing keys here (<service>.key, made when missing)")
    p.add_argument("--command-keys-file", type=Path, metavar="PATH",
                   help="with --service-keys-dir: write their public keys here, the agents' trusted command keys")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_gateway_init)


def _fail(message: object, code: int) -> int:
    print(f"gpusched gateway-init: {message}", file=sys.stderr)
    return code


def read_password(path: Path) -> str:
    """The password ``path`` holds, stripped; ValueError saying what is wrong (never echoing it)."""
    try:
        password = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read the role password file {str(path)!r}: {exc}") from None
    if not password:
        raise ValueError(f"the role password file {str(path)!r} is empty")
    if not password.isprintable():
        raise ValueError(f"the role password in {str(path)!r} must be one line of printable text")
    return password


async def provision(conn: asyncpg.Connection, key_file: Path, password: str | None) -> Provisioned:
    before = producers.read_key_file(key_file)
    # one transaction: a stale producer is revoked and renamed only together with its replacement's creation
    async with conn.transaction():
        key = await producers.ensure(conn, key_file, name=GATEWAY_PRODUCER, tenants=(OPERATOR,), attests=True,
                                     created_by=issuer(), now=datetime.now(UTC))
        if password is not None:
            await db_roles.enable_login(conn, GATEWAY_ROLE, password)
    created = before is None or before.producer_id != key.producer_id
    return Provisioned(key.producer_id, created, password is not None, key.public_key_text())


def cmd_gateway_init(args: argparse.Namespace) -> int:
    key_file: Path = args.producer_key_file
    try:
        if key_file.is_dir():
            raise ValueError(f"the producer key file {str(key_file)!r} is a directory")
        password = read_password(args.role_password_file) if args.role_password_file is not None else None
        done = with_conn(lambda conn: provision(conn, key_file, password))
    except ValueError as exc:
        return _fail(exc, 2)
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return _fail(f"database: {exc}", 1)
    except OSError as exc:  # the key file could not be written, or the server not reached
        where = f"the producer key file {str(key_file)!r}" if exc.filename else "database"
        return _fail(f"{where}: {exc}", 1)
    if args.public_key_file is not None:
        try:
            write_public_key(args.public_key_file, done.public_key)
        except OSError as exc:
            return _fail(f"the public key file {str(args.public_key_file)!r}: {exc}", 1)
    if getattr(args, "service_keys_dir", None) is not None:
        try:
            entries = senders.provision_service_keys(args.service_keys_dir)
            if args.command_keys_file is not None:
                write_public_key(args.command_keys_file, entries)
        except (OSError, ValueError) as exc:
            return _fail(f"service keys in {str(args.service_keys_dir)!r}: {exc}", 1)
        if not args.json:
            print(f"service keys: {', '.join(senders.SIGNING_SERVICES)} in {args.service_keys_dir}"
                  + (f"; agents trust them from {args.command_keys_file}" if args.command_keys_file else ""))
    _report(done, key_file, args.json)
    return 0


def write_public_key(path: Path, public_key: str) -> None:
    """Replace ``path`` with the public key (written beside it, then renamed: a reader never sees half)."""
    write_public(path, public_key + "\n")


def _report(done: Provisioned, key_file: Path, as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "producer": {"producer_id": done.producer_id, "name": GATEWAY_PRODUCER, "created": done.producer_created,
                         "key_file": str(key_file), "public_key": done.public_key},
            "role": {"role": GATEWAY_ROLE, "login_enabled": True} if done.login_enabled else None,
        }, indent=2))
        return
    if done.producer_created:
        print(f"producer {GATEWAY_PRODUCER}: created {done.producer_id}, its key written to {key_file} (mode 0600)")
    else:
        print(f"producer {GATEWAY_PRODUCER}: kept {done.producer_id} ({key_file} holds its valid key)")
    if done.login_enabled:
        print(f"database role {GATEWAY_ROLE}: login enabled with the password from the role password file")
    print(f"agents serve jobs' logs to the gateway with GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY={done.public_key}")
