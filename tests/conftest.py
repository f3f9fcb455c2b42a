"""Fixtures that start real infrastructure: a Tansu broker and private PostgreSQL databases."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpusched_common.db import drop_database, ensure_database, migrate
from gpusched_common.kafka_admin import create_topics
from gpusched_common.settings import Settings

PG_SERVER = os.environ.get("GPUSCHED_TEST_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")


@pytest.fixture
def broker_bootstrap(tmp_path: Path) -> Iterator[str]:
    """A fresh in-memory Tansu broker per test (it starts in milliseconds), so tests never share offsets."""
    from services.cli.stack import start_broker, stop_pid

    pid, bootstrap = start_broker(tmp_path)
    yield bootstrap
    stop_pid(pid)


@pytest.fixture
async def topics(broker_bootstrap: str) -> str:
    await create_topics(broker_bootstrap, partitions=3)
    return broker_bootstrap


async def fresh_database(prefix: str) -> str:
    url = f"{PG_SERVER}/{prefix}_{uuid.uuid4().hex[:10]}"
    await ensure_database(url)
    await migrate(url)
    return url


@pytest.fixture
async def database_url() -> AsyncIterator[str]:
    url = await fresh_database("gpusched_test")
    yield url
    await drop_database(url)


@pytest.fixture
def settings(database_url: str, topics: str, tmp_path: Path) -> Settings:
    return Settings(database_url=database_url, kafka_bootstrap=topics, handler_retry_backoff_s=0.01,
                    kafka_session_timeout_ms=2000,
                    agent_work_dir=tmp_path / "agents")
