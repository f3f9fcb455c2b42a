"""The job runner's records on disk (gpusched_common/job_records.py): a file in the work dir that is not
a readable record is skipped with a log line, never a reason for the agent to fail."""

from __future__ import annotations

import asyncio
import logging
import os

from gpusched_common.job_records import JobRecord, start_ticks, write_record

from services.node_agent.runner import _WRAPPER, JobRunner
from tests.unit.node_agent.test_agent_shell import Recorder, an_agent, eventually, start

FOREIGN = {"settings.json": '{"theme": "dark"}', "torn.json": '{"job_id": "torn", "pid": 12',
           "list.json": "[1, 2]", "partial.json": '{"job_id": "partial"}'}


def litter(work_dir) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    for name, text in FOREIGN.items():
        (work_dir / name).write_text(text)
    (work_dir / "binary.json").write_bytes(b"\xff\xfe\x00")


async def test_records_skip_a_foreign_or_damaged_json_with_a_log_line(tmp_path, caplog):
    runner = JobRunner(tmp_path / "n1")
    job = await runner.start("j1", ["true"], (0,), {})
    await runner.wait(job)
    litter(runner.work_dir)

    with caplog.at_level(logging.WARNING, logger="services.node_agent.runner"):
        records = runner.records()

    assert [r.job_id for r in records] == ["j1"]
    skipped = [r.getMessage() for r in caplog.records if "not a readable job record" in r.getMessage()]
    assert len(skipped) == 5 and all(any(name in line for line in skipped) for name in [*FOREIGN, "binary.json"])
    assert [o.job_id for o in runner.observe()] == ["j1"] and runner.running_job_ids() == []


async def test_an_agent_starts_and_runs_jobs_beside_a_foreign_json_in_its_work_dir(tmp_path):
    litter(tmp_path / "n1")
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    assert sent.of("NodeRegistered")[0]["running_jobs"] == []
    await agent.check_lease()
    await agent.on_command(start("j1", "true"))
    await eventually(lambda: sent.of("JobExitReported"))
    assert [(e["job_id"], e["exit_code"]) for e in sent.of("JobExitReported")] == [("j1", 0)]
    await agent.close()


async def test_a_job_stopped_before_its_command_began_still_gets_the_polite_stop(tmp_path):
    """The SIGTERM of a stop goes to the job's processes, never to its wrapper; a stop that comes while the
    wrapper has not started the command yet (it waits at its gate, or is not yet scheduled on a busy node)
    signals the command once it appears, instead of letting it run until the SIGKILL at the deadline."""
    runner = JobRunner(tmp_path / "n1")
    runner.work_dir.mkdir(parents=True, exist_ok=True)
    exit_file = tmp_path / "j1.exit"
    gate_in, gate_out = os.pipe()
    wrapper = await asyncio.create_subprocess_exec(
        "sh", "-c", _WRAPPER, "gpusched-job", "sleep", "30", stdin=gate_in, start_new_session=True,
        env={"PATH": os.environ["PATH"], "GPUSCHED_JOB_DIR": str(tmp_path), "GPUSCHED_EXIT_FILE": str(exit_file)})
    os.close(gate_in)
    write_record(runner.work_dir, JobRecord("j1", wrapper.pid, (0,), 0.0, start_ticks(wrapper.pid)))
    stopping = asyncio.create_task(runner.stop("j1", grace_s=60))
    await asyncio.sleep(0.3)  # the stop looked once: nothing but the wrapper, held at its gate
    os.write(gate_out, b"go\n")
    os.close(gate_out)
    assert await asyncio.wait_for(stopping, 30)
    assert await wrapper.wait() == 143  # the command ended of its SIGTERM and the wrapper recorded it
    assert exit_file.read_text().strip() == "143"
