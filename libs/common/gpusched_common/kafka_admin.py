"""Create the project's topics idempotently (used by `gpusched create-topics`, the local stack and tests)."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError, for_code

from gpusched_common.topics import ALL_TOPICS

# Records up to this size are accepted (Settings.kafka_max_request_bytes). Apache Kafka refuses records
# over ~1 MiB by default, and an oversized submission must reach admission to be rejected with a reason.
DEFAULT_MAX_MESSAGE_BYTES = 2 * 1024 * 1024


class TopicCreationFailed(RuntimeError):
    """The broker refused to create some topics (not authorised, invalid settings, ...)."""


async def _connect(options: dict, timeout_s: float) -> AIOKafkaAdminClient:
    """An admin client, retrying while the broker is not up yet."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        admin = AIOKafkaAdminClient(client_id="gpusched-admin", **options)
        try:
            await admin.start()
            return admin
        except KafkaConnectionError:
            await admin.close()
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.3)


async def create_topics(bootstrap: str, partitions: int, replication: int = 1, *, timeout_s: float = 30.0,
                        client: dict | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[str]:
    """Create every missing topic; returns the names created. `client`: further aiokafka options (the
    security of `kafka_client.client_options`). Raises TopicCreationFailed with the broker's reasons when
    it refuses any (the admin client reports them in the response, not as exceptions)."""
    admin = await _connect({**(client or {}), "bootstrap_servers": bootstrap}, timeout_s)
    try:
        existing = set(await admin.list_topics())
        missing = [t.name for t in ALL_TOPICS if t.name not in existing]
        if not missing:
            return []
        config = {"max.message.bytes": str(max_message_bytes)}
        response = await admin.create_topics([NewTopic(name, partitions, replication, topic_configs=config)
                                              for name in missing])
        refused = {}
        for name, code, *message in response.topic_errors:
            if code not in (0, TopicAlreadyExistsError.errno):  # already there: a concurrent creator won
                refused[name] = f"{for_code(code).__name__}{': ' + message[0] if message and message[0] else ''}"
        if refused:
            raise TopicCreationFailed("the broker refused to create " + "; ".join(
                f"{name} ({why})" for name, why in sorted(refused.items())))
        return missing
    finally:
        await admin.close()
