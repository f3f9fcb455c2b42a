"""`gpusched migrate | create-topics | export-schemas`: what an operator runs once per deployment."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from aiokafka.errors import KafkaConnectionError

from gpusched_common.db import ensure_database, migrate
from gpusched_common.kafka_admin import TopicCreationFailed, create_topics
from gpusched_common.kafka_client import KafkaSecurityError, client_options
from gpusched_common.settings import Settings

SCHEMAS_DIR = Path(__file__).resolve().parents[3] / "schemas"  # the repository's schemas/


def add_ops_parsers(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("migrate", help="apply database migrations").set_defaults(func=cmd_migrate)
    p = sub.add_parser("create-topics", help="create Kafka topics")
    p.add_argument("--replication", type=int, default=1)
    p.set_defaults(func=cmd_create_topics)
    p = sub.add_parser("export-schemas", help="write event JSON Schemas")
    p.add_argument("--dir", default=str(SCHEMAS_DIR))
    p.add_argument("--check", action="store_true", help="fail if the files differ from the models")
    p.set_defaults(func=cmd_export_schemas)


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = Settings()

    async def go() -> list[str]:
        await ensure_database(settings.database_url)
        return await migrate(settings.database_url)

    applied = asyncio.run(go())
    print(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none needed'}")
    return 0


def cmd_create_topics(args: argparse.Namespace) -> int:
    settings = Settings()
    try:
        created = asyncio.run(create_topics(settings.kafka_bootstrap, settings.kafka_partitions, args.replication,
                                            client=client_options(settings),
                                            max_message_bytes=settings.kafka_max_request_bytes,
                                            command_partitions=settings.node_command_partitions))
    except (TopicCreationFailed, KafkaConnectionError, KafkaSecurityError) as exc:
        print(f"gpusched create-topics: {exc}", file=sys.stderr)
        return 1
    print(f"created {len(created)} topic(s): {', '.join(created) or 'all existed'}")
    return 0


def cmd_export_schemas(args: argparse.Namespace) -> int:
    from gpusched_common.schema_export import render_schemas, write_schemas

    directory = Path(args.dir)
    if args.check:
        stale = [name for name, text in render_schemas().items()
                 if not (directory / name).exists() or (directory / name).read_text() != text]
        if stale:
            print(f"schemas out of date: {', '.join(stale)}; run `gpusched export-schemas`", file=sys.stderr)
            return 1
        print("schemas up to date")
        return 0
    print(f"wrote {len(write_schemas(directory))} schema file(s) to {directory}")
    return 0
