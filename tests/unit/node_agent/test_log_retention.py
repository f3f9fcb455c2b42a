"""An agent keeps an ended job's output for the retention period after its last write, then deletes it
with the files of its finished runs; a job with a current run here is never touched."""

from __future__ import annotations

import os

import pytest

from gpusched_core.agent.retention import KeptLog, expired
from services.node_agent.runner import JobRunner

DAY = 86400.0


@pytest.mark.parametrize("log, gone", [
    (KeptLog("j", 0.0, current_run=False), True),           # ended 10 days ago
    (KeptLog("j", 5 * DAY, current_run=False), False),      # 5 days ago: still kept
    (KeptLog("j", 0.0, current_run=True), False),           # a run here (long quiet): never
    (KeptLog("j", 3 * DAY, current_run=False), False),      # exactly at the retention: kept
])
def test_what_is_past_its_retention(log, gone):
    assert expired([log], now_s=10 * DAY, retention_s=7 * DAY) == (["j"] if gone else [])


def test_the_runner_deletes_an_ended_job_s_output_and_its_set_aside_runs_only(tmp_path):
    runner = JobRunner(tmp_path)
    (runner.job_dir("old")).mkdir()
    (runner.job_dir("old") / "results.txt").write_text("x")
    files = ["old.log", "old.json.run1", "old.exit.run1", "old.reported.run1", "old.1.log", "old.1.json.run1",
             "live.log", "live.json", "other.log"]
    for name in files:
        (tmp_path / name).write_text("x")
    os.utime(tmp_path / "live.log", (0, 0))  # quiet for long, but it has a current run
    os.utime(tmp_path / "old.log", (0, 0))
    kept = {k.job_id: k for k in runner.kept_logs()}
    assert kept["live"].current_run and not kept["old"].current_run
    for job_id in expired(kept.values(), now_s=30 * DAY, retention_s=7 * DAY):
        runner.forget_output(job_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["old.1.log", "old.1.json.run1", "live.log", "live.json", "other.log", "jobs"])
    assert not runner.job_dir("old").exists()
