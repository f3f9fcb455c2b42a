"""`gpusched producers`: operators create, list and revoke credentialed producers, the programs that
publish `JobSubmitted` on `gpusched.jobs.submitted` themselves (README: "Submitting as a producer").

    gpusched producers create --name N (--tenant T ... | --all-tenants) [--attests] [--json]  # key shown once
    gpusched producers list [--json]
    gpusched producers revoke PRODUCER_ID          # its next submission is refused

A producer signs each message with its Ed25519 key; admission checks the signature against the public key
the store keeps and takes the tenant only from what the producer is bound to. `--attests` (the gateway's
own producer) lets it name the principal that submitted through it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import datetime, timezone

import asyncpg

from gpusched_cli.tokens import issuer, when, with_conn
from gpusched_common import producers
from gpusched_common.table import render


def add_producers_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("producers", help="credentialed producers of submissions: create, list, revoke")
    sub = p.add_subparsers(dest="producers_cmd", required=True)
    create = sub.add_parser("create", help="create a producer; its key is shown once, only the public key is kept")
    create.add_argument("--name", required=True, help="what the producer is, e.g. airflow-research")
    create.add_argument("--tenant", action="append", default=[], help="a tenant it may submit for (repeat)")
    create.add_argument("--all-tenants", action="store_true", help="it may submit for any tenant")
    create.add_argument("--attests", action="store_true",
                        help="it names the principal that submitted through it (the gateway)")
    create.add_argument("--json", action="store_true")
    create.set_defaults(func=cmd_create)
    listing = sub.add_parser("list", help="every producer: tenants, attestation, revocation")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=cmd_list)
    revoke = sub.add_parser("revoke", help="revoke a producer, effective at its next submission")
    revoke.add_argument("producer_id")
    revoke.set_defaults(func=cmd_revoke)
    return p


def _fail(message: object, code: int) -> int:
    print(f"gpusched producers: {message}", file=sys.stderr)
    return code


def _json_info(info: producers.ProducerInfo) -> dict[str, object]:
    out = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(info).items()}
    return {**out, "tenants": list(info.tenants)}


def cmd_create(args: argparse.Namespace) -> int:
    try:
        tenants = producers.checked_tenants(args.tenant, args.all_tenants)
        text, info = with_conn(lambda conn: producers.create(
            conn, name=args.name, tenants=tenants, attests=args.attests, created_by=issuer(),
            now=datetime.now(timezone.utc)))
    except ValueError as exc:
        return _fail(exc, 2)
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if args.json:
        print(json.dumps({"key": text, **_json_info(info)}, indent=2))
        return 0
    print(f"producer {info.producer_id} ({info.name}) for tenants {', '.join(info.tenants)}"
          + (", attesting its callers" if info.attests else "") + "; its key:")
    print(text)
    print("This key will not be shown again: only its public half is stored. Give it to the producer's program "
          "(GPUSCHED_PRODUCER_KEY_FILE) and keep it secret.")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    try:
        found = with_conn(producers.list_producers)
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if args.json:
        print(json.dumps([_json_info(i) for i in found], indent=2))
        return 0
    rows = [(i.producer_id, i.name, ",".join(i.tenants), "yes" if i.attests else "no", when(i.created_at),
             i.created_by, when(i.revoked_at)) for i in found]
    print(render(["ID", "NAME", "TENANTS", "ATTESTS", "CREATED", "BY", "REVOKED"], rows))
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    if producers.parse_producer_id(args.producer_id) is None:
        return _fail(f"invalid producer id {args.producer_id!r} (16 hex digits, see `gpusched producers list`)", 2)
    try:
        revoked = with_conn(lambda conn: producers.revoke(conn, args.producer_id, datetime.now(timezone.utc)))
    except asyncpg.PostgresError as exc:
        return _fail(f"database: {exc}", 1)
    if not revoked:
        return _fail(f"no unrevoked producer {args.producer_id} (see `gpusched producers list`)", 1)
    print(f"revoked producer {args.producer_id}")
    return 0
