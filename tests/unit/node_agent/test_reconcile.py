"""The reconcile core: what a (re)started agent does with the processes it finds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common.events import ExitReason

from gpusched_core.agent.reconcile import (
    Adopt, Forget, ObservedJob, ReportExit, ReportMissing, ResendExit, Stop, plan_reconcile,
)


def running(job_id: str, stopped: str | None = None) -> ObservedJob:
    return ObservedJob(job_id, pid=100, alive=True, stop_reason=stopped)


def ended(job_id: str, code: int | None = 0, reported: bool = False, stopped: str | None = None) -> ObservedJob:
    return ObservedJob(job_id, pid=100, alive=False, exit_code=code, reported=reported, stop_reason=stopped)


@pytest.mark.parametrize("observed, wanted, lease_valid, expected", [
    pytest.param([running("j1")], None, True, (Adopt("j1"),), id="a running job is adopted when the store is unknown"),
    pytest.param([running("j1")], {"j1"}, True, (Adopt("j1"),), id="a running job the store wants is adopted"),
    pytest.param([running("j1")], set(), True, (Stop("j1", ExitReason.NOT_ASSIGNED),), id="a running job nobody wants is stopped"),
    pytest.param([running("j1", stopped=ExitReason.STOPPED)], {"j1"}, True, (Stop("j1", ExitReason.STOPPED),),
                 id="a job an earlier agent began to stop is stopped for that reason"),
    pytest.param([ended("j1", 3)], None, True, (ReportExit("j1", 3),),
                 id="a job that ended while the agent was down has its exit reported"),
    pytest.param([ended("j1", None)], {"j1"}, True, (ReportExit("j1", 137),),
                 id="a job that vanished without an exit code is reported killed"),
    pytest.param([ended("j1", 143, stopped=ExitReason.LEASE_LOST)], {"j1"}, True,
                 (ReportExit("j1", 143, ExitReason.LEASE_LOST),),
                 id="a job an earlier agent stopped is reported with the reason it was stopped for"),
    pytest.param([ended("j1", 143, stopped=ExitReason.NOT_ASSIGNED)], None, True, (Forget("j1"),),
                 id="a job an earlier agent stopped because the store did not want it is forgotten"),
    pytest.param([ended("j1", 0, reported=True)], None, True, (), id="a reported job is left alone"),
    pytest.param([ended("j1", 0, reported=True)], set(), True, (), id="a reported job the store forgot is left alone"),
    pytest.param([ended("j1", 0, reported=True)], {"j1"}, True, (ResendExit("j1"),),
                 id="a reported job the store still expects has its report sent again (it was lost)"),
    pytest.param([ended("j1", 0, reported=True)], {"j1"}, False, (), id="a lost lease resends nothing"),
    pytest.param([ended("j1", 0)], set(), True, (Forget("j1"),), id="an unwanted ended job is forgotten"),
    pytest.param([], {"j9"}, True, (ReportMissing("j9"),), id="a wanted job the agent never ran is reported missing"),
    pytest.param([running("j1"), running("j2")], {"j1", "j2"}, False, (Stop("j1", ExitReason.LEASE_LOST), Stop("j2", ExitReason.LEASE_LOST)),
                 id="a lost lease stops every live job"),
    pytest.param([ended("j1", 0)], {"j1", "j2"}, False, (), id="a lost lease reports nothing"),
])
def test_reconcile_table(observed, wanted, lease_valid, expected):
    wanted = frozenset(wanted) if wanted is not None else None
    assert plan_reconcile(observed, wanted, lease_valid=lease_valid) == expected


def run_of(job: ObservedJob, attempt: int) -> ObservedJob:
    return ObservedJob(job.job_id, job.pid, job.alive, job.exit_code, job.reported, job.stop_reason, attempt)


@pytest.mark.parametrize("observed, wanted, expected", [
    pytest.param([run_of(ended("j1", 0, reported=True), 1)], {"j1": 2}, (ReportMissing("j1"),),
                 id="the store wants a later run than the one whose exit was reported: that run is missing, "
                    "not a lost report (its resend would be ignored as another run's, for good)"),
    pytest.param([run_of(ended("j1", 0, reported=True), 2)], {"j1": 2}, (ResendExit("j1"),),
                 id="the wanted run's report was lost: sent again"),
    pytest.param([run_of(running("j1"), 1)], {"j1": 2}, (Stop("j1", ExitReason.NOT_ASSIGNED), ReportMissing("j1")),
                 id="a live earlier run is stopped and the wanted run reported missing"),
    pytest.param([run_of(running("j1"), 2)], {"j1": 2}, (Adopt("j1"),), id="the wanted run alive is adopted"),
    pytest.param([run_of(ended("j1", 3), 1)], {"j1": 2}, (Forget("j1"), ReportMissing("j1")),
                 id="an earlier run's unreported exit is forgotten and the wanted run reported missing"),
    pytest.param([ended("j1", 0, reported=True)], {"j1": 2}, (ResendExit("j1"),),
                 id="a run of no recorded attempt is taken for the wanted one, as before"),
])
def test_a_run_of_another_attempt_is_not_the_wanted_one(observed, wanted, expected):
    assert plan_reconcile(observed, frozenset(wanted), attempts=wanted) == expected


def test_missing_uses_the_reason_code_placement_requeues_on():
    assert ExitReason.MISSING_AFTER_RESTART == "missing_after_restart"


jobs = st.lists(st.builds(ObservedJob, job_id=st.sampled_from(["a", "b", "c", "d"]), pid=st.integers(1, 9),
                          alive=st.booleans(), exit_code=st.one_of(st.none(), st.integers(0, 255)),
                          reported=st.booleans(), stop_reason=st.one_of(st.none(), st.sampled_from(list(ExitReason)))),
                  unique_by=lambda j: j.job_id)
wanted_sets = st.one_of(st.none(), st.frozensets(st.sampled_from(["a", "b", "c", "d", "e"])))


@given(jobs, wanted_sets, st.booleans())
def test_no_job_is_both_kept_and_stopped_and_the_plan_is_deterministic(observed, wanted, lease_valid):
    plan = plan_reconcile(observed, wanted, lease_valid=lease_valid)
    assert plan == plan_reconcile(list(reversed(observed)), wanted, lease_valid=lease_valid)
    ids = [a.job_id for a in plan]
    assert len(ids) == len(set(ids)), plan
    alive = {j.job_id for j in observed if j.alive}
    for action in plan:
        if isinstance(action, Adopt):
            assert lease_valid and action.job_id in alive and (wanted is None or action.job_id in wanted)
        if isinstance(action, Stop):
            assert action.job_id in alive
    if not lease_valid:
        assert {a.job_id for a in plan if isinstance(a, Stop)} == alive
        assert all(isinstance(a, Stop | Forget) for a in plan)


def test_the_next_epoch_is_above_every_one_used_and_at_least_the_store_s_floor(tmp_path):
    from services.node_agent.runner import JobRunner
    runner = JobRunner(tmp_path)
    assert runner.next_epoch() == 1
    assert runner.next_epoch(at_least=7) == 7
    assert runner.next_epoch() == 8
    assert runner.next_epoch(at_least=3) == 9


def test_a_command_is_carried_out_once_within_the_window_and_forgotten_after_it():
    from gpusched_core.agent.seen import SeenCommands

    seen = SeenCommands(window_s=10.0, limit=3)
    assert seen.first_time("a", 0.0) and not seen.first_time("a", 5.0)
    assert seen.first_time("b", 6.0) and seen.first_time("a", 10.5)  # "a" aged out of the window
    for i, event in enumerate("cdef"):
        assert seen.first_time(event, 11.0 + i)
    assert seen.first_time("b", 16.0)  # over the limit: the oldest are forgotten first
