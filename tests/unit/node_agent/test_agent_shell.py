"""The agent shell with real subprocesses and a recording transport (the broker tests are in
tests/integration/test_agent_broker.py)."""

from __future__ import annotations

import asyncio
import uuid
import json
from datetime import datetime, timezone
from pathlib import Path

from gpusched_common import events as ev
from gpusched_common.messaging import Incoming

from services.node_agent.agent import Agent
from services.node_agent.config import AgentConfig
from services.node_agent.faults import Fault
from services.node_agent.nvml import SimulatedNvml
from services.node_agent.runner import JobRunner


class Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    async def __call__(self, topic: str, key: str, value: bytes, headers: dict[str, str]) -> None:
        self.sent.append((topic, json.loads(value)))

    def of(self, kind: str) -> list[dict]:
        return [m["payload"] for _, m in self.sent if m["type"] == kind]


def an_agent(tmp: Path, sent: Recorder, **config) -> Agent:
    return Agent(AgentConfig("n1", **config), sent, SimulatedNvml("n1", "H100-80GB:2"), JobRunner(tmp / "n1"))


def command(payload: ev.Payload) -> Incoming:
    envelope = ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id="node-n1", occurred_at=datetime.now(timezone.utc),
                                producer="test")
    return Incoming("gpusched.nodes.commands", 0, 0, "n1", envelope.model_dump_json().encode(), {})


def start(job_id: str, *cmd: str, gpus=(0,)) -> Incoming:
    return command(ev.StartJob(job_id=job_id, node_id="n1", tenant="t", gpu_indices=list(gpus),
                               gpu_uuids=[f"GPU-{i}" for i in gpus], command=list(cmd)))


async def eventually(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_restarted_agent_adopts_its_running_job_and_reports_its_exit_once(tmp_path):
    first_sent = Recorder()
    first = an_agent(tmp_path, first_sent)
    await first.start()
    await first.on_command(start("j1", "sh", "-c", "sleep 0.6; exit 3"))
    await first.close()  # the agent dies; its job keeps running

    sent = Recorder()
    second = an_agent(tmp_path, sent)
    await second.start()
    assert sent.of("NodeRegistered")[0]["running_jobs"] == ["j1"]
    assert sent.of("NodeRegistered")[0]["lease_epoch"] == first.lease.epoch + 1
    await second.on_command(start("j1", "sh", "-c", "exit 0"))  # a redelivered StartJob starts nothing
    await eventually(lambda: sent.of("JobExitReported"))
    await asyncio.sleep(0.3)
    assert [(e["job_id"], e["exit_code"]) for e in sent.of("JobExitReported")] == [("j1", 3)]
    # nothing new started: the repeat is answered with the start of the run the node has
    assert [s["pid"] for s in sent.of("JobStartReported")] == [first_sent.of("JobStartReported")[0]["pid"]]
    await second.close()


async def test_an_unhealthy_gpu_is_reported_and_its_job_stopped_by_policy(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent, fence_grace_s=0.2)
    await agent.start()
    await agent.on_command(start("j1", "sleep", "30", gpus=(1,)))
    agent.backend.inject(Fault("xid", 1, 79))
    await agent.health_once()
    await agent.flush()
    change = sent.of("GpuHealthChanged")[0]
    assert (change["gpu_index"], change["healthy"], change["status"], change["xid"]) == (1, False, "lost", 79)
    assert (change["job_ids"], change["job_action"]) == (["j1"], "stopped")
    await eventually(lambda: sent.of("JobExitReported"))
    exit_report = sent.of("JobExitReported")[0]
    assert exit_report["reason_code"] == "gpu_unhealthy" and "fell off the bus" in exit_report["error"]
    await agent.on_command(start("j2", "true", gpus=(1,)))  # nothing new starts on a cordoned GPU
    await agent.flush()
    assert sent.of("JobExitReported")[-1]["reason_code"] == "gpu_unhealthy"
    await agent.close()


async def test_an_agent_that_loses_its_lease_stops_its_jobs_and_returns_with_a_new_epoch(tmp_path):
    clock = [0.0]
    sent = Recorder()
    agent = Agent(AgentConfig("n1", lease_ttl_s=5.0, fence_grace_s=0.2, heartbeat_interval_s=1.0), sent,
                  SimulatedNvml("n1", "H100-80GB:2"), JobRunner(tmp_path / "n1"), monotonic=lambda: clock[0])
    await agent.start()
    epoch = agent.lease.epoch
    await agent.on_command(start("j1", "sleep", "30"))
    agent.set_partitioned(True)
    clock[0] = 4.0
    await agent.heartbeat_once()
    await agent.check_lease()
    assert agent.lease.valid
    clock[0] = 5.5
    await agent.check_lease()
    assert not agent.lease.valid
    await eventually(lambda: not agent.runner.running_job_ids())  # fenced: the job is gone
    await agent.on_command(start("j2", "true"))  # and nothing starts while fenced
    assert not agent.runner.known("j2")
    agent.set_partitioned(False)
    clock[0] = 6.0
    await agent.heartbeat_once()
    assert agent.lease.valid and agent.lease.epoch == epoch + 1
    await asyncio.wait_for(agent.flush(), 10)
    assert sent.of("NodeRegistered")[-1]["lease_epoch"] == epoch + 1
    await eventually(lambda: sent.of("JobExitReported"))
    lost = [e for e in sent.of("JobExitReported") if e["job_id"] == "j1"][0]
    assert (lost["reason_code"], lost["lease_epoch"]) == ("lease_lost", epoch)
    beats = sent.of("NodeHeartbeat")
    assert beats and beats[-1]["lease_ttl_s"] == 5.0 and beats[-1]["fence_grace_s"] == 0.2
    await agent.close()


async def test_a_job_fenced_by_an_agent_that_died_before_it_ended_is_reported_fenced_by_the_next(tmp_path):
    """The reason a job was stopped for outlives the agent that stopped it: a run fenced for a lost lease
    whose agent is restarted before the run ends is requeued, not failed with its SIGTERM's 143."""
    clock = [0.0]
    first = Agent(AgentConfig("n1", lease_ttl_s=5.0, fence_grace_s=20.0, heartbeat_interval_s=1.0), Recorder(),
                  SimulatedNvml("n1", "H100-80GB:2"), JobRunner(tmp_path / "n1"), monotonic=lambda: clock[0])
    await first.start()
    epoch = first.lease.epoch
    await first.on_command(start("j1", "sh", "-c", "trap 'sleep 0.5; exit 143' TERM; sleep 30 & wait"))
    first.set_partitioned(True)
    clock[0] = 5.5
    await first.check_lease()  # fenced: SIGTERM, and the job takes its time to go
    await eventually(lambda: first.runner.stop_reason("j1") == "lease_lost")
    await first.close()  # the agent dies before the job ended (perhaps before it was signalled)

    sent = Recorder()
    second = an_agent(tmp_path, sent)
    await second.start()
    await eventually(lambda: sent.of("JobExitReported"), timeout_s=10)  # stopped again if it was not signalled
    report = sent.of("JobExitReported")[0]
    assert (report["job_id"], report["exit_code"], report["reason_code"], report["lease_epoch"]) == \
        ("j1", 143, "lease_lost", epoch)
    assert "lease (epoch" in report["error"]
    await second.close()


async def test_telemetry_maps_gpu_processes_to_jobs(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    await agent.on_command(command(ev.StartJob(job_id="j1", node_id="n1", tenant="t", gpu_indices=[1],
                                               gpu_uuids=["GPU-1"], command=["sleep", "5"], gpu_share_milli=500,
                                               gpu_memory_mib=1024)))
    await agent.flush()
    assert sent.of("JobStartReported")[0]["unenforced"]  # no MPS daemon here
    await agent.telemetry_once()
    sample = sent.of("GpuTelemetry")[0]["samples"][1]
    assert sample["utilization_pct"] > 0 and sample["processes"][0]["job_id"] == "j1"
    await agent.on_command(command(ev.StopJob(job_id="j1", node_id="n1", reason="cancelled")))
    await eventually(lambda: sent.of("JobExitReported"))
    assert sent.of("JobExitReported")[0]["reason_code"] == "stopped"
    await agent.close()


async def test_scheduled_faults_fire_once_when_due(tmp_path):
    clock = [0.0]
    sent = Recorder()
    agent = Agent(AgentConfig("n1", faults=(Fault("ecc", 0, 2, after_s=10.0),)), sent,
                  SimulatedNvml("n1", "H100-80GB:2"), JobRunner(tmp_path / "n1"), monotonic=lambda: clock[0])
    await agent.start()
    await agent.health_once()
    clock[0] = 11.0
    await agent.health_once()
    await agent.health_once()
    await agent.flush()
    assert [(h["gpu_index"], h["status"], h["reasons"]) for h in sent.of("GpuHealthChanged")] == [
        (0, "unhealthy", ["2 uncorrected ECC error(s)"])]
    await agent.close()


def start_at(job_id: str, epoch: int) -> Incoming:
    return command(ev.StartJob(job_id=job_id, node_id="n1", tenant="t", gpu_indices=[0], gpu_uuids=["GPU-0"],
                               command=["true"], lease_epoch=epoch))


async def test_a_start_placed_for_an_earlier_epoch_waits_for_the_store_s_list_of_this_epoch(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    agent.runner.next_epoch()
    await agent.start()  # a restart: epoch 2; placement placed two jobs while it still knew epoch 1
    epoch = agent.lease.epoch
    await agent.on_command(start_at("kept", epoch - 1))
    await agent.on_command(start_at("moved", epoch - 1))
    await agent.on_command(start_at("forged-future", epoch + 5))
    await agent.flush()
    assert not sent.of("JobStartReported")  # nothing runs on a fenced token by itself
    await agent.on_command(command(ev.ReconcileJobs(node_id="n1", job_ids=["kept"], lease_epoch=epoch)))
    await eventually(lambda: sent.of("JobExitReported"))
    await agent.flush()
    assert [r["job_id"] for r in sent.of("JobStartReported")] == ["kept"]  # the store still means it for here
    assert [r["job_id"] for r in sent.of("JobExitReported")] == ["kept"]  # "moved" runs elsewhere: dropped
    await agent.close()


async def test_a_held_start_of_an_earlier_run_does_not_run_when_the_store_lists_the_job_at_a_later_one(tmp_path):
    """The store lists "again" for this node, but as its third run: the held StartJob is of its first run (placed
    here long ago, before the job moved on). Started, it would run under a stale attempt whose reports the
    store ignores; it is dropped, and a held start of the run the store names runs."""
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    agent.runner.next_epoch()
    await agent.start()
    epoch = agent.lease.epoch
    for job_id, attempt in (("again", 1), ("current", 2)):
        await agent.on_command(command(ev.StartJob(job_id=job_id, node_id="n1", tenant="t", gpu_indices=[0],
                                                   gpu_uuids=["GPU-0"], command=["true"], lease_epoch=epoch - 1,
                                                   attempt=attempt)))
    await agent.on_command(command(ev.ReconcileJobs(node_id="n1", job_ids=["again", "current"], lease_epoch=epoch,
                                                    attempts={"again": 3, "current": 2})))
    await eventually(lambda: len(sent.of("JobExitReported")) == 2)
    await agent.flush()
    assert [(r["job_id"], r["attempt"]) for r in sent.of("JobStartReported")] == [("current", 2)]
    missing = [r for r in sent.of("JobExitReported") if r["job_id"] == "again"]
    assert missing and missing[0]["reason_code"] == "missing_after_restart", missing
    await agent.close()


async def test_a_job_placed_here_again_whose_new_run_never_started_is_reported_missing_not_its_old_exit(tmp_path):
    """Found by the fault campaign on Apache Kafka: a job's first run ended here and was reported; the job
    was requeued and placed here again (run 2), and the agent never started that run. Each ReconcileJobs
    listing the job made the agent send run 1's exit again, which placement ignored as another run's: the
    job stayed expected here for good (stuck, its quota held). The wanted run is reported missing instead."""
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    epoch = agent.lease.epoch
    await agent.on_command(start("again", "true"))  # run 1
    await eventually(lambda: sent.of("JobExitReported"))
    await agent.flush()
    sent.sent.clear()
    await agent.on_command(command(ev.ReconcileJobs(node_id="n1", job_ids=["again"], lease_epoch=epoch,
                                                    attempts={"again": 2})))
    await eventually(lambda: sent.of("JobExitReported"))
    await agent.flush()
    [report] = sent.of("JobExitReported")
    assert (report["reason_code"], report["attempt"]) == ("missing_after_restart", None), report
    await agent.close()


async def test_a_reconcile_published_again_after_the_broker_lost_its_data_stops_nothing_started_since(tmp_path):
    """Found by the broker-restart test on Tansu: the relay published the registration's ReconcileJobs
    again (the same envelope), the agent read it a second time and stopped, as not assigned, every job
    started since; they ended Failed 143. A command seen before is not carried out twice; a new one is."""
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    epoch = agent.lease.epoch
    registration_answer = command(ev.ReconcileJobs(node_id="n1", job_ids=[], lease_epoch=epoch))
    await agent.on_command(registration_answer)
    await agent.on_command(start_at("later", epoch))  # a StartJob of the confirmed epoch runs at once
    await agent.on_command(start("long", "sleep", "30", gpus=(1,)))
    await eventually(lambda: {r["job_id"] for r in sent.of("JobStartReported")} == {"later", "long"})
    await agent.on_command(registration_answer)  # published again: the same event
    await agent.flush()
    assert agent.runner.stop_reason("long") is None and "long" in agent.runner.running_job_ids()
    await agent.on_command(command(ev.ReconcileJobs(node_id="n1", job_ids=["later"], lease_epoch=epoch)))
    await eventually(lambda: "long" not in agent.runner.running_job_ids())  # a new list: obeyed
    assert agent.runner.stop_reason("long") == "not_assigned"
    await agent.close()


async def test_an_agent_told_its_node_was_declared_lost_stops_its_jobs_and_registers_again(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    epoch = agent.lease.epoch
    await agent.on_command(start("j1", "sleep", "30"))
    await eventually(lambda: agent.runner.running_job_ids())
    await agent.on_command(command(ev.NodeLost(node_id="n1", lease_epoch=epoch - 1, reason="old news")))
    assert agent.lease.epoch == epoch and agent.runner.running_job_ids()  # an older epoch's notice: nothing
    await agent.on_command(command(ev.NodeLost(node_id="n1", lease_epoch=epoch, reason="silent for 41s")))
    await eventually(lambda: not agent.runner.running_job_ids())  # its jobs run elsewhere now
    assert agent.lease.epoch == epoch + 1 and agent.lease.valid
    await asyncio.wait_for(agent.flush(), 10)
    assert sent.of("NodeRegistered")[-1]["lease_epoch"] == epoch + 1
    await eventually(lambda: [e for e in sent.of("JobExitReported") if e["job_id"] == "j1"])
    await agent.close()


async def test_a_start_sent_again_for_the_run_the_node_has_is_answered_with_its_start_again(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    await agent.on_command(start("j1", "sleep", "30"))
    await agent.flush()
    assert len([s for s in sent.of("JobStartReported") if s["job_id"] == "j1"]) == 1
    await agent.on_command(start("j1", "sleep", "30"))  # placement heard nothing: it sends the run again
    await agent.flush()
    starts = [s for s in sent.of("JobStartReported") if s["job_id"] == "j1"]
    assert len(starts) == 2 and starts[0]["pid"] == starts[1]["pid"]  # the same run, not a second one
    assert agent.runner.running_job_ids() == ["j1"]
    await agent.close()


async def test_a_late_report_of_an_earlier_run_does_not_mark_the_run_started_since(tmp_path):
    """Found by the fault campaign on Apache Kafka (a gang's run 4 and run 5 alive on one node together): a
    run's exit was reported twice (its watcher's report and a reconcile's, queued while the broker was
    away); the first was taken, the job was placed here again and its next run started, and then the second
    was taken, and its mark fell on the new run: that run counted as ended and reported while it ran, and
    the next StartJob started beside it. A report marks only the run it is about, and a run whose process
    still runs is never replaced."""
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()

    def start_run(attempt: int, *cmd: str) -> Incoming:
        return command(ev.StartJob(job_id="j", node_id="n1", tenant="t", gpu_indices=[0], gpu_uuids=["GPU-0"],
                                   command=list(cmd), attempt=attempt))

    await agent.on_command(start_run(1, "true"))
    await eventually(lambda: agent.runner.reported("j"))
    await agent.on_command(start_run(2, "sleep", "30"))
    await eventually(lambda: [s for s in sent.of("JobStartReported") if s["attempt"] == 2])
    agent.exits.report_exit(ev.JobExitReported(job_id="j", node_id="n1", exit_code=0, runtime_s=0.0, attempt=1))
    await agent.flush()  # the late report of run 1 is taken now
    assert not agent.runner.reported("j")
    await agent.on_command(start_run(3, "sleep", "30"))
    await agent.flush()
    assert [s["attempt"] for s in sent.of("JobStartReported")] == [1, 2]
    assert agent.runner.record("j").attempt == 2 and agent.runner.running_job_ids() == ["j"]
    # even a run marked reported by mistake is not replaced while its process runs
    agent.runner.mark_reported("j", attempt=2)
    await agent.on_command(start_run(3, "sleep", "30"))
    await agent.flush()
    assert [s["attempt"] for s in sent.of("JobStartReported")] == [1, 2]
    await agent.close()


def run_of(job_id: str, attempt: int, *cmd: str) -> Incoming:
    return command(ev.StartJob(job_id=job_id, node_id="n1", tenant="t", gpu_indices=[0], gpu_uuids=["GPU-0"],
                               command=list(cmd), attempt=attempt))


async def test_a_run_placed_here_while_the_earlier_one_still_stops_starts_when_that_one_s_end_is_reported(tmp_path):
    """A gang requeued (or a job preempted) and placed on this node again: its StopJob and the next run's
    StartJob come one after the other, while the earlier run is still in its grace. The next run starts once
    the earlier one's end is reported (not at placement's re-send 30 s later), and never beside it."""
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    # run 1 takes a moment to stop: it checkpoints on SIGTERM
    await agent.on_command(run_of("g", 1, "sh", "-c", "trap 'sleep 0.5; exit 143' TERM; sleep 30 & wait"))
    await eventually(lambda: sent.of("JobStartReported"))
    await agent.on_command(command(ev.StopJob(job_id="g", node_id="n1", reason="gang member on n2 ended the job")))
    await agent.on_command(run_of("g", 2, "sleep", "30"))
    assert [s["attempt"] for s in sent.of("JobStartReported")] == [1]  # not beside the run that stops
    await eventually(lambda: [s for s in sent.of("JobStartReported") if s["attempt"] == 2], timeout_s=10)
    ends = [e for e in sent.of("JobExitReported") if e["job_id"] == "g"]
    assert [(e["attempt"], e["reason_code"]) for e in ends] == [(1, "stopped")]
    order = [(m["type"], m["payload"].get("attempt")) for _, m in agent_reports(sent)]
    assert order.index(("JobExitReported", 1)) < order.index(("JobStartReported", 2))
    assert agent.runner.record("g").attempt == 2 and agent.runner.running_job_ids() == ["g"]
    await agent.close()


def agent_reports(sent: Recorder) -> list[tuple[str, dict]]:
    return [(t, m) for t, m in sent.sent if m["type"] in ("JobStartReported", "JobExitReported")]


async def test_a_run_waiting_for_the_earlier_one_that_is_stopped_or_unlisted_never_starts(tmp_path):
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    epoch = agent.lease.epoch
    await agent.on_command(command(ev.ReconcileJobs(node_id="n1", job_ids=[], lease_epoch=epoch)))
    for job_id in ("stopped", "preempted", "unlisted"):
        await agent.on_command(run_of(job_id, 1, "sh", "-c", "trap 'sleep 1; exit 143' TERM; sleep 30 & wait"))
    await eventually(lambda: len(sent.of("JobStartReported")) == 3)
    for job_id in ("stopped", "preempted", "unlisted"):
        await agent.on_command(command(ev.StopJob(job_id=job_id, node_id="n1", reason="requeued")))
        await agent.on_command(run_of(job_id, 2, "sleep", "30"))  # waits for run 1's end
    await agent.on_command(command(ev.StopJob(job_id="stopped", node_id="n1", reason="cancelled by alice")))
    await agent.on_command(command(ev.PreemptJob(job_id="preempted", node_id="n1", reason="reclaim", grace_s=1.0,
                                                 deadline_at=datetime.now(timezone.utc))))
    await agent.on_command(command(ev.ReconcileJobs(node_id="n1", job_ids=["stopped", "preempted", "unlisted"],
                                                    lease_epoch=epoch, attempts={"stopped": 2, "preempted": 2,
                                                                                 "unlisted": 3})))
    await eventually(lambda: not agent.runner.running_job_ids(), timeout_s=10)
    await agent.flush()
    never = {(e["job_id"], e["attempt"], e["reason_code"]) for e in sent.of("JobExitReported") if e["attempt"] == 2}
    assert never == {("stopped", 2, "stopped"), ("preempted", 2, "preempted")}
    assert [s["attempt"] for s in sent.of("JobStartReported")] == [1, 1, 1]
    await agent.close()


async def test_a_stop_or_preemption_of_an_earlier_run_leaves_the_later_run_be(tmp_path):
    """StopJob and PreemptJob name the run they are about: one of an earlier run, sent again or late (the
    preemption service's commands are not ordered with placement's StartJobs), neither stops the job's later
    run on the node nor drops a run that waits for the earlier one; one of the run, or of none, does."""
    sent = Recorder()
    agent = an_agent(tmp_path, sent)
    await agent.start()
    await agent.on_command(run_of("j", 1, "true"))
    await eventually(lambda: agent.runner.reported("j"))
    await agent.on_command(run_of("j", 2, "sleep", "30"))
    await eventually(lambda: [s for s in sent.of("JobStartReported") if s["attempt"] == 2])
    await agent.on_command(command(ev.StopJob(job_id="j", node_id="n1", reason="gang requeued", attempt=1)))
    await agent.on_command(command(ev.PreemptJob(job_id="j", node_id="n1", reason="reclaim", grace_s=1.0,
                                                 deadline_at=datetime.now(timezone.utc), attempt=1)))
    await agent.flush()
    assert agent.runner.running_job_ids() == ["j"] and not agent.exits.stopping("j")
    # run 3 placed here while run 2 stops: a late StopJob of run 2 leaves run 3 waiting; run 3's own stops it
    await agent.on_command(command(ev.StopJob(job_id="j", node_id="n1", reason="requeued", attempt=2)))
    await agent.on_command(run_of("j", 3, "sleep", "30"))
    await agent.on_command(command(ev.StopJob(job_id="j", node_id="n1", reason="requeued", attempt=2)))
    await eventually(lambda: [s for s in sent.of("JobStartReported") if s["attempt"] == 3], timeout_s=10)
    await agent.on_command(command(ev.StopJob(job_id="j", node_id="n1", reason="cancelled", attempt=3)))
    await eventually(lambda: not agent.runner.running_job_ids(), timeout_s=10)
    await agent.flush()
    assert [(e["attempt"], e["reason_code"]) for e in sent.of("JobExitReported")] == [
        (1, None), (2, "stopped"), (3, "stopped")]
    await agent.close()
