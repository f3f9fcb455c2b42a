"""The whole local stack as processes, in a private home directory and database."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpusched_common.db import drop_database
from gpusched_common.settings import Settings
from gpusched_cli import stack


@pytest.fixture(scope="module")
async def local_stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, broker_kind: str,
                      pg_server: str) -> AsyncIterator[stack.StackState]:
    """One stack per test module and broker; a module may set STACK_ENV for settings of its own, and
    STACK_NODES, STACK_GPU_MODELS and STACK_GPUS_PER_NODE for its cluster."""
    home = tmp_path_factory.mktemp("stack")
    previous = os.environ.get("GPUSCHED_HOME")
    os.environ["GPUSCHED_HOME"] = str(home)
    trace_file = home / "traces.jsonl"
    state = None
    try:
        state = await stack.up(
            nodes=getattr(request.module, "STACK_NODES", 2),
            gpu_models=getattr(request.module, "STACK_GPU_MODELS", ["H100-80GB", "A100-80GB"]),
            gpus_per_node=getattr(request.module, "STACK_GPUS_PER_NODE", 8),
            database_name=f"gpusched_e2e_{uuid.uuid4().hex[:8]}", progress=lambda line: None,
            broker=broker_kind, pg_server=pg_server,
            extra_env={"GPUSCHED_TRACE_EXPORTER": "file", "GPUSCHED_TRACE_FILE": str(trace_file),
                       "GPUSCHED_KAFKA_SESSION_TIMEOUT_MS": "2000", "GPUSCHED_TELEMETRY_INTERVAL_S": "1",
                       "GPUSCHED_METRICS_LOG_INTERVAL_S": "1", **getattr(request.module, "STACK_ENV", {})})
        yield state
    finally:
        stack.down(progress=lambda line: None)
        if state is not None:
            await drop_database(state.database_url)
        if previous is None:
            os.environ.pop("GPUSCHED_HOME", None)
        else:
            os.environ["GPUSCHED_HOME"] = previous


@pytest.fixture
def stack_settings(local_stack: stack.StackState) -> Settings:
    return stack.client_settings(local_stack)


def read_spans(home: str) -> list[dict]:
    path = Path(home) / "traces.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
