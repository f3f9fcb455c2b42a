"""Hold and release (pure): a waiting job is set aside (a Queued one gives its reservation back), kept out
of line until released, then back in line at its original submission time; nothing else may be held."""

from __future__ import annotations

import pytest

from gpusched_common import events as ev
from gpusched_core import lifecycle as d
from tests.builders import T0
from tests.unit.lifecycle.test_decide import SPEC, _apply, admitted, queued, running

HOLD = d.Hold("maintenance window", requested_by="token:0123456789abcdef:alice")


@pytest.mark.parametrize("make", [admitted, queued], ids=["Admitted", "Queued"])
def test_a_waiting_job_is_held_and_released_at_its_submission_time(make):
    held = _apply(make(), HOLD)
    assert held.status is d.JobStatus.HELD and held.last_reasons == ("held: maintenance window",)
    assert d.decide(held, HOLD, T0) == ()  # held twice: nothing new
    [released] = d.decide(held, d.Release("token:0123456789abcdef:alice"), T0)
    assert released == ev.JobReleased(job_id="j1", submitted_at=T0, requested_by="token:0123456789abcdef:alice")
    assert d.evolve(held, released).status is d.JobStatus.ADMITTED


def test_a_held_queued_job_gives_its_reservation_back():
    held = _apply(queued(), HOLD)
    assert held.quota_held
    [released] = d.decide(held, d.ReleaseQuota(0), T0)
    assert isinstance(released, ev.QuotaReleased)
    assert d.evolve(held, released).status is d.JobStatus.HELD  # still held, no longer charged


def test_a_running_job_cannot_be_held_and_a_job_not_held_is_not_released():
    with pytest.raises(d.InvalidTransition, match="only a waiting job"):
        d.decide(running(), HOLD, T0)
    assert d.decide(admitted(), d.Release(), T0) == ()


def test_a_job_submitted_held_is_admitted_then_held():
    events = d.decide(d.JobState("j1"), d.RegisterSubmission(SPEC, T0, hold=True), T0)
    assert [type(e) for e in events] == [ev.JobSubmitted, ev.JobAdmitted, ev.JobHeld]
    assert d.fold("j1", events).status is d.JobStatus.HELD


def test_a_held_job_can_be_cancelled():
    [event] = d.decide(_apply(admitted(), HOLD), d.Cancel("gone"), T0)
    assert isinstance(event, ev.JobCancelled)
