"""The job runner's records on disk (gpusched_common/job_records.py): a file in the work dir that is not
a readable record is skipped with a log line, never a reason for the agent to fail."""

from __future__ import annotations

import logging

from services.node_agent.runner import JobRunner
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
