"""Create the project's topics idempotently (used by `gpusched create-topics`, the local stack and tests)."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from gpusched_common.topics import ALL_TOPICS


# Records up to this size are accepted (Settings.kafka_max_request_bytes). Apache Kafka refuses records
# over ~1 MiB by default, and an oversized submission must reach admission to be rejected with a reason.
DEFAULT_MAX_MESSAGE_BYTES = 2 * 1024 * 1024


async def create_topics(bootstrap: str, partitions: int, replication: int = 1, *, timeout_s: float = 30.0,
                        client: dict | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[str]:
    """Create every missing topic; returns the names created. `client`: further aiokafka options (the
    security of `kafka_client.client_options`)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    options = {**(client or {}), "bootstrap_servers": bootstrap}
    while True:
        admin = AIOKafkaAdminClient(client_id="gpusched-admin", **options)
        try:
            await admin.start()
            break
        except KafkaConnectionError:
            await admin.close()
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)
    try:
        existing = set(await admin.list_topics())
        missing = [t.name for t in ALL_TOPICS if t.name not in existing]
        if missing:
            try:
                config = {"max.message.bytes": str(max_message_bytes)}
                await admin.create_topics([NewTopic(name, partitions, replication, topic_configs=config)
                                           for name in missing])
            except TopicAlreadyExistsError:
                pass  # a concurrent creator won
        return missing
    finally:
        await admin.close()
