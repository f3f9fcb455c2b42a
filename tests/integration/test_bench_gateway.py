"""`make bench-gateway` end to end, with tiny parameters, on the test's broker and database: the bench runs
as its own process (as the Makefile runs it), writes every metric, and each job it counts as accepted is a
record on gpusched.jobs.submitted, signed by the gateway. Speeds are never asserted: only that there are some."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from gpusched_common.infra.brokers import RunningBroker
from gpusched_common.producers import PRODUCER_HEADER
from gpusched_common.topics import JOBS_SUBMITTED
from tests.integration.kafka_helpers import read_topic

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("submit_per_s", "batch_submit_jobs_per_s", "read_p50_ms", "read_p99_ms", "floor_hello_per_s")
TINY = ["--duration", "1", "--concurrency", "2", "--batch-size", "50", "--batch-concurrency", "1",
        "--read-concurrency", "2", "--seed-jobs", "20"]


async def run_bench(*argv: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpusched_cli.bench_gateway", *argv, cwd=ROOT,
                                                env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    output, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
    assert proc.returncode is not None
    return proc.returncode, output.decode(errors="replace")


async def test_the_bench_reports_every_metric_and_every_accepted_job_reached_the_topic(
        database_url: str, topics: str, running_broker: RunningBroker, tmp_path: Path):
    out = tmp_path / "gateway.json"
    env = {**os.environ, "GPUSCHED_KAFKA_IDEMPOTENCE": str(running_broker.idempotence).lower()}
    code, output = await run_bench(*TINY, "--bootstrap", topics, "--database-url", database_url,
                                   "--home", str(tmp_path / "bench"), "--out", str(out), env=env)
    assert code == 0, output[-4000:]
    result = json.loads(out.read_text())
    for key in METRICS:
        assert isinstance(result[key], int | float) and result[key] > 0, (key, result[key])
    assert result["failures"] == {}
    assert "floor" in output and "POST /v1/jobs:batch (50 jobs)" in output

    records = await read_topic(topics, JOBS_SUBMITTED.name, expect=result["jobs_accepted"], timeout_s=30)
    assert len(records) == result["jobs_accepted"] == result["topic_records"]
    assert len({r.key for r in records}) == len(records)  # every accepted job is a job of its own
    assert all(PRODUCER_HEADER in dict(r.headers) for r in records)
