"""The agent's side of the preemption protocol, with real subprocesses: notice + SIGTERM, a checkpoint
written in the grace period is reported before the exit, SIGKILL at the deadline."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from gpusched_common import events as ev
from tests.unit.node_agent.test_agent_shell import Recorder, an_agent, command, eventually, start

# A job that checkpoints periodically and, on SIGTERM, reads its notice, writes a final checkpoint, exits.
CHECKPOINTING_JOB = (
    'trap \'cat "$GPUSCHED_PREEMPT_NOTICE_FILE" > notice.seen; echo ckpt-final > "$GPUSCHED_CHECKPOINT_FILE";'
    ' exit 143\' TERM; echo ckpt-1 > "$GPUSCHED_CHECKPOINT_FILE"; while true; do sleep 0.05; done'
)


def preempt(job_id: str, grace_s: float) -> ev.PreemptJob:
    return ev.PreemptJob(job_id=job_id, node_id="n1", grace_s=grace_s, reason="for j-hp",
                         deadline_at=datetime.now(timezone.utc) + timedelta(seconds=grace_s))


async def test_a_preempted_job_checkpoints_in_its_grace_period_and_is_reported_preempted(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    await agent.on_command(start("j1", "sh", "-c", CHECKPOINTING_JOB))
    await eventually(lambda: agent.runner.read_checkpoint("j1") == "ckpt-1")
    await agent.checkpoints_once()
    await agent.on_command(command(preempt("j1", grace_s=5.0)))
    await agent.on_command(command(preempt("j1", grace_s=5.0)))  # redelivered: one stop only
    await eventually(lambda: sent.of("JobExitReported"))
    await agent.flush()
    kinds = [m["type"] for _, m in sent.sent if m["type"] in ("JobCheckpointReported", "JobExitReported")]
    assert kinds == ["JobCheckpointReported", "JobCheckpointReported", "JobExitReported"]
    assert [c["checkpoint_ref"] for c in sent.of("JobCheckpointReported")] == ["ckpt-1", "ckpt-final"]
    assert sent.of("JobExitReported")[0]["reason_code"] == "preempted"
    notice = json.loads((tmp_path / "n1" / "jobs" / "j1" / "notice.seen").read_text())
    assert notice["reason"] == "for j-hp" and "deadline_at" in notice
    await agent.close()


async def test_a_job_that_ignores_the_notice_is_killed_at_the_deadline(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    await agent.on_command(start("j1", "sh", "-c", "trap '' TERM; touch ready; while true; do sleep 0.05; done"))
    await eventually(lambda: (tmp_path / "n1" / "jobs" / "j1" / "ready").exists())  # the job runs and ignores SIGTERM
    began = datetime.now(timezone.utc)
    await agent.on_command(command(preempt("j1", grace_s=0.5)))
    await eventually(lambda: sent.of("JobExitReported"), timeout_s=5)
    assert (datetime.now(timezone.utc) - began).total_seconds() >= 0.4
    exit_report = sent.of("JobExitReported")[0]
    assert exit_report["reason_code"] == "preempted" and exit_report["exit_code"] != 0
    await agent.close()
