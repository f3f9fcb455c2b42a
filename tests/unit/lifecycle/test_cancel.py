"""Cancelling in every state (pure): a job holding no GPUs ends Cancelled at once; one holding GPUs is asked
to stop and ends Cancelled when its agent reports the exit (also when its node is lost, or while it was being
preempted); a finished job and a second cancel change nothing."""

from __future__ import annotations

import pytest

from gpusched_common import events as ev
from gpusched_core import lifecycle as d
from tests.builders import T0
from tests.unit.lifecycle.test_decide import _apply, admitted, placed, queued, running

CANCEL = d.Cancel("no longer needed", requested_by="token:0123456789abcdef:alice")


@pytest.mark.parametrize("make", [admitted, queued], ids=["Admitted", "Queued"])
def test_a_job_holding_no_gpus_ends_cancelled_at_once_with_who_and_why(make):
    [event] = d.decide(make(), CANCEL, T0)
    assert event == ev.JobCancelled(job_id="j1", reason="no longer needed", requested_by=CANCEL.requested_by)
    assert d.evolve(make(), event).status is d.JobStatus.CANCELLED


@pytest.mark.parametrize("make", [placed, running], ids=["Placed", "Running"])
def test_a_job_holding_gpus_is_asked_to_stop_and_ends_cancelled_when_its_exit_is_reported(make):
    [asked] = d.decide(make(), CANCEL, T0)
    assert isinstance(asked, ev.JobCancelRequested)
    state = d.evolve(make(), asked)
    assert state.status is make().status and state.cancel == asked  # still holding its GPUs
    assert d.decide(state, CANCEL, T0) == ()  # asked twice: nothing new
    [ended] = d.decide(state, d.RecordExit("n1", -15, 3.0), T0)  # SIGTERM
    assert ended == ev.JobCancelled(job_id="j1", reason="no longer needed", requested_by=CANCEL.requested_by)


def test_a_job_that_exits_on_its_own_while_being_cancelled_still_ends_cancelled_once():
    state = _apply(running(), CANCEL)
    [ended] = d.decide(state, d.RecordExit("n1", 0, 3.0), T0)
    assert isinstance(ended, ev.JobCancelled)
    finished = d.evolve(state, ended)
    assert d.decide(finished, d.RecordExit("n1", 0, 3.0), T0) == ()  # a repeated report: one end
    assert d.decide(finished, CANCEL, T0) == ()


def test_a_node_lost_while_cancelling_ends_the_job_instead_of_requeueing_it():
    state = _apply(running(), CANCEL)
    [ended] = d.decide(state, d.Requeue("n1", "node lost"), T0)
    assert isinstance(ended, ev.JobCancelled)


def test_a_cancel_during_a_preemption_ends_cancelled_not_preempted():
    preempting = _apply(running(), d.RequestPreemption("p1", 100, "b", "for p1", 30.0, T0))
    assert preempting.status is d.JobStatus.PREEMPTING
    state = _apply(preempting, CANCEL)
    [ended] = d.decide(state, d.RecordExit("n1", -9, 3.0), T0)
    assert isinstance(ended, ev.JobCancelled)


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_finished_job_is_left_as_it_is(exit_code):
    done = _apply(running(), d.RecordExit("n1", exit_code, 1.0))
    assert done.status in (d.JobStatus.SUCCEEDED, d.JobStatus.FAILED)
    assert d.decide(done, CANCEL, T0) == ()


def test_a_job_that_does_not_exist_cannot_be_cancelled():
    with pytest.raises(d.InvalidTransition):
        d.decide(d.JobState("nope"), CANCEL, T0)
