"""`gpusched tenants`: operators change the tenancy at run time and see the one in force.

    gpusched tenants apply FILE [--wait 30]   # validate, publish TenancyUpdated signed with an operator key,
                                              # and wait until the quota service applied or rejected it
    gpusched tenants show [--json]            # the revision in force, usage against quota, rejections
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path


from gpusched_common import events as ev
from gpusched_common.credentials import key_for, load_keys, signed_headers
from gpusched_common.identity import OPERATOR
from gpusched_common.db import connect
from gpusched_common.messaging import build_broker, publish
from gpusched_common.settings import Settings
from gpusched_common.stores.tenancy import update_outcome
from gpusched_common.topics import TENANCY_UPDATES

from gpusched_common.table import render
from gpusched_core.quota import TenancyError, format_gpus, load_tenancy

TENANCY_KEY = "tenancy"  # one partition key: updates stay in the order they were published


def add_tenants_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("tenants", help="the tenancy in force; apply a new revision (operators)")
    sub = p.add_subparsers(dest="tenants_cmd", required=True)
    apply = sub.add_parser("apply", help="publish a tenancy file revision (signed with an operator key)")
    apply.add_argument("file")
    apply.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the outcome (0: do not)")
    apply.set_defaults(func=cmd_apply)
    show = sub.add_parser("show", help="the revision in force and usage against quota, through the gateway")
    show.add_argument("--tenant", help="one tenant (default: yours, or every tenant for an operator or viewer)")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_show)
    return p


def update_message(document: str, revision: int, source: str, now: datetime) -> tuple[str, bytes]:
    """(event id, envelope bytes) of a ``TenancyUpdated``."""
    payload = ev.TenancyUpdated(revision=revision, document=document, published_at=now, source=source)
    event_id = str(uuid.uuid4())
    envelope = ev.make_envelope(payload, event_id=event_id, stream_id="tenancy", occurred_at=now, producer="cli")
    return event_id, envelope.model_dump_json().encode()


async def publish_tenancy(settings: Settings, document: str, source: str) -> str:
    """Validate ``document`` and publish it signed with an operator key; the event id. Raises
    ``TenancyError`` for an invalid file and ``ValueError`` without an operator key."""
    tenancy = load_tenancy(document)
    keys = load_keys(settings.tenant_keys_file) if settings.tenant_keys_file else {}
    key = key_for(keys, OPERATOR)
    if key is None:
        raise ValueError("no operator key (tenant '*') in GPUSCHED_TENANT_KEYS_FILE to sign the update with")
    event_id, value = update_message(document, tenancy.revision, source, datetime.now(timezone.utc))
    headers = {"event-type": ev.TenancyUpdated.TYPE, **signed_headers(key, value)}
    broker = build_broker(settings, client_id="gpusched-tenants")
    await broker.connect()
    try:
        await publish(broker, TENANCY_UPDATES.name, TENANCY_KEY, value, headers)
    finally:
        await broker.stop()
    return event_id


async def wait_for_outcome(database_url: str, event_id: str, timeout_s: float) -> tuple[str, list[str]] | None:
    conn = await connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        while (found := await update_outcome(conn, event_id)) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return found
    finally:
        await conn.close()


def cmd_apply(args: argparse.Namespace) -> int:
    from gpusched_cli.operator_settings import operator_settings as _settings

    settings = _settings()
    try:
        document = Path(args.file).read_text()
        event_id = asyncio.run(publish_tenancy(settings, document, source=f"gpusched tenants apply {args.file}"))
    except (TenancyError, ValueError, OSError) as exc:
        print(f"gpusched tenants apply: {exc}", file=sys.stderr)
        return 2
    revision = load_tenancy(document).revision
    print(f"published revision {revision} of {args.file} ({event_id})")
    if args.wait <= 0:
        return 0
    found = asyncio.run(wait_for_outcome(settings.database_url, event_id, args.wait))
    if found is None:
        print(f"no outcome after {args.wait:g}s; `gpusched tenants show` tells later", file=sys.stderr)
        return 1
    state, problems = found
    if state == "applied":
        print(f"revision {revision} is in force")
        return 0
    print(f"revision {revision} was not applied:", *(f"  - {p}" for p in problems), sep="\n", file=sys.stderr)
    return 1



def cmd_show(args: argparse.Namespace) -> int:
    """Usage against nominal quota and borrowing, per tenant and flavor, through the gateway."""
    from gpusched_cli.job_commands import through_gateway

    def work(client) -> int:  # noqa: ANN001 - a gpusched.Client
        view = client.tenants(args.tenant)
        if args.json:
            print(json.dumps(view, indent=2, default=str))
            return 0
        print(f"revision {view['revision']} in force" if view.get("revision") is not None else "no tenancy in force")
        rows = [(u["tenant"], u["flavor"], format_gpus(u["reserved_units"]), format_gpus(u["nominal_units"]),
                 format_gpus(u["borrowed_units"]), "-" if u["limit_units"] is None else format_gpus(u["limit_units"]))
                for u in view["usage"]]
        print(render(["TENANT", "FLAVOR", "RESERVED", "NOMINAL", "BORROWED", "LIMIT"], rows))
        return 0

    return through_gateway("tenants show", work)