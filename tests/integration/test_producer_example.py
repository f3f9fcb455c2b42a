"""examples/producer.py, the program platform teams copy, speaks the contract admission enforces: run as
its own process against the real broker, with a producer key made by `producers.create`, its submission is
admitted for the producer's tenant (submitted by `producer:<name>`) and rejected, naming the tenant, for
any other; admission runs in-process on real PostgreSQL and its outcomes reach `gpusched.jobs.events`."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from gpusched_common import producers
from gpusched_common.db import connect
from gpusched_common.ids import job_id_for_request
from gpusched_common.runtime import running
from gpusched_common.settings import Settings
from gpusched_common.topics import JOBS_EVENTS, JOBS_SUBMITTED

from services.admission.app import setup as admission_setup
from services.admission.settings import AdmissionSettings
from tests.integration.kafka_helpers import read_topic

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "producer.py"
NAME = "example-platform"


async def make_key_file(settings: Settings, path: Path) -> str:
    """A producer for tenant `a`, its key written where the example reads it; its id."""
    conn = await connect(settings.database_url)
    try:
        text, info = await producers.create(conn, name=NAME, tenants=("a",), attests=False, created_by="test",
                                            now=datetime.now(UTC))
    finally:
        await conn.close()
    path.write_text(text + "\n")
    path.chmod(0o600)
    return info.producer_id


async def run_example(*args: str, env: dict[str, str] | None = None) -> str:
    """Run the example as a separate program; the job id it printed."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    proc = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), *args, env={**clean, **(env or {})},
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out.decode().strip()


async def decided_job(database_url: str, job_id: str, timeout_s: float = 30.0) -> dict:
    """The job's row once admission decided it (polled: admission runs on its own consumer)."""
    conn = await connect(database_url)
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            row = await conn.fetchrow("SELECT status, reasons, submitted_by, tenant FROM jobs WHERE job_id = $1",
                                      job_id)
            if row is not None and row["status"] in ("Admitted", "Rejected"):
                return dict(row)
            assert asyncio.get_running_loop().time() < deadline, f"job {job_id} not decided; row {row!r}"
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


def test_the_example_imports_no_gpusched_package():
    tree = ast.parse(EXAMPLE.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not [m for m in imported if m.split(".")[0] in ("gpusched_common", "gpusched_cli", "gpusched_core",
                                                           "services")], imported
    assert len(EXAMPLE.read_text().splitlines()) <= 130


def test_the_example_uses_gpusched_s_topic_headers_and_job_ids():
    spec = importlib.util.spec_from_file_location("producer_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # defines only; main() runs under __main__
    assert example.TOPIC == JOBS_SUBMITTED.name
    source = EXAMPLE.read_text()
    assert f'"{producers.PRODUCER_HEADER}"' in source and f'"{producers.SIGNATURE_HEADER}"' in source
    assert example.job_id_for("a", "nightly-1") == job_id_for_request("a", "nightly-1")


async def test_the_example_producer_is_admitted_for_its_tenant_and_rejected_for_another(settings, tmp_path):
    key_file = tmp_path / "producer.key"
    producer_id = await make_key_file(settings, key_file)
    admission = AdmissionSettings.of(settings, admission_require_credentials=True)
    async with running("admission", admission, admission_setup):
        # configured from the environment, as a deployed program would be
        admitted_id = await run_example("--tenant", "a", "--gpus", "2", "--", "python", "train.py", "--epochs", "3",
                                        env={"GPUSCHED_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                                             "GPUSCHED_PRODUCER_KEY_FILE": str(key_file)})
        # configured by arguments, for a tenant the producer is not bound to
        rejected_id = await run_example("--bootstrap", settings.kafka_bootstrap, "--key-file", str(key_file),
                                        "--tenant", "b", "--", "true")
        admitted = await decided_job(settings.database_url, admitted_id)
        rejected = await decided_job(settings.database_url, rejected_id)
        outcomes = await read_topic(settings.kafka_bootstrap, JOBS_EVENTS.name, expect=3, timeout_s=30)
    assert admitted_id.startswith("j-") and rejected_id.startswith("j-") and admitted_id != rejected_id
    assert (admitted["status"], admitted["submitted_by"], admitted["tenant"]) == ("Admitted", f"producer:{NAME}", "a")
    assert rejected["status"] == "Rejected"
    assert rejected["reasons"] == [f"producer {NAME!r} may not submit for tenant 'b' (its tenants: a)"]
    conn = await connect(settings.database_url)
    try:
        first = await conn.fetchval("SELECT payload FROM events WHERE stream_id = $1 ORDER BY version LIMIT 1",
                                    f"job-{admitted_id}")
        submitted = json.loads(first) if isinstance(first, str) else first
        assert (submitted["spec"]["gpus"], submitted["spec"]["command"]) == (2, ["python", "train.py", "--epochs", "3"])
        assert submitted["producer"] == producer_id  # the credential that signed it, recorded by admission
    finally:
        await conn.close()
    # the outcomes a producer follows, keyed by the job id it chose
    by_job = {}
    for record in outcomes:
        by_job.setdefault(record.key.decode(), []).append(json.loads(record.value)["type"])
    assert "JobAdmitted" in by_job[admitted_id]
    assert by_job[rejected_id] == ["JobRejected"]
