from __future__ import annotations

from typing import get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common import events as ev
from gpusched_core import lifecycle as d
from gpusched_core.lifecycle.decisions import HANDLERS
from tests.builders import T0, a_job

SPEC = a_job("j1").gpus(2).spec()


def admitted() -> d.JobState:
    return d.fold("j1", d.decide(d.JobState("j1"), d.RegisterSubmission(SPEC, T0), T0))


def queued() -> d.JobState:
    state = admitted()
    return d.fold("j1", [*_history(state), *d.decide(state, d.ReserveQuota(2, 8), T0)])


def placed() -> d.JobState:
    state = queued()
    return _apply(state, d.Place("n1", (0, 1), ("u0", "u1"), "H100-80GB", "firstfit", "fits"))


def running() -> d.JobState:
    return _apply(placed(), d.RecordStart("n1", 42, T0))


def _history(state: d.JobState) -> list[ev.Payload]:
    # rebuild a state's events for the helpers above (the decider is pure, so replaying is exact)
    events = list(d.decide(d.JobState("j1"), d.RegisterSubmission(SPEC, T0), T0))
    return events if state.status is d.JobStatus.ADMITTED else []


def _apply(state: d.JobState, command: d.Command) -> d.JobState:
    for event in d.decide(state, command, T0):
        state = d.evolve(state, event)
    return state


def test_a_valid_submission_is_submitted_then_admitted():
    events = d.decide(d.JobState("j1"), d.RegisterSubmission(SPEC, T0), T0)
    assert [type(e) for e in events] == [ev.JobSubmitted, ev.JobAdmitted]
    assert d.fold("j1", events).status is d.JobStatus.ADMITTED


def test_a_submission_with_reasons_is_rejected_with_every_reason():
    events = d.decide(d.JobState("j1"), d.RegisterSubmission(None, T0, ("a", "b"), tenant_hint="t"), T0)
    assert events == (ev.JobRejected(job_id="j1", tenant="t", reasons=["a", "b"]),)


def test_a_duplicate_submission_creates_nothing():
    assert d.decide(admitted(), d.RegisterSubmission(SPEC, T0), T0) == ()


@pytest.mark.parametrize(("state", "command", "expected"), [
    pytest.param(admitted, d.ReserveQuota(2, 8), [ev.QuotaReserved], id="admitted-reserves-quota"),
    pytest.param(queued, d.ReserveQuota(2, 8), [], id="reserving-twice-is-a-no-op"),
    pytest.param(queued, d.Place("n1", (0,), ("u",), "m", "p", "r"), [ev.JobPlaced], id="queued-is-placed"),
    pytest.param(placed, d.Place("n1", (0,), ("u",), "m", "p", "r"), [], id="placing-twice-on-same-node-no-op"),
    pytest.param(placed, d.RecordStart("n1", 1, T0), [ev.JobStarted], id="placed-starts"),
    pytest.param(running, d.RecordStart("n1", 1, T0), [], id="second-start-report-ignored"),
    pytest.param(running, d.RecordExit("n1", 0, 1.0), [ev.JobSucceeded], id="exit-0-succeeds"),
    pytest.param(running, d.RecordExit("n1", 3, 1.0), [ev.JobFailed], id="exit-3-fails"),
    pytest.param(placed, d.RecordExit("n1", 0, 1.0), [ev.JobSucceeded], id="exit-before-start-report"),
    pytest.param(running, d.RecordExit("n2", 0, 1.0), [], id="exit-from-another-node-ignored"),
    pytest.param(queued, d.DeferPlacement(("no room",)), [ev.PlacementDeferred], id="queued-defers"),
    pytest.param(running, d.Cancel("user"), [ev.JobCancelRequested], id="running-is-asked-to-stop"),
    pytest.param(queued, d.Cancel("user"), [ev.JobCancelled], id="queued-cancels"),
])
def test_transitions(state, command, expected):
    assert [type(e) for e in d.decide(state(), command, T0)] == expected


@pytest.mark.parametrize(("state", "command"), [
    pytest.param(admitted, d.Place("n1", (0,), ("u",), "m", "p", "r"), id="place-before-quota"),
    pytest.param(lambda: d.JobState("j1"), d.ReserveQuota(1, 1), id="quota-for-unknown-job"),
    pytest.param(lambda: d.JobState("j1"), d.Cancel("x"), id="cancel-unknown-job"),
])
def test_invalid_transitions_raise(state, command):
    with pytest.raises(d.InvalidTransition):
        d.decide(state(), command, T0)


def test_every_command_in_the_union_has_a_handler_and_every_handler_a_command():
    assert set(HANDLERS) == set(get_args(d.Command))


def test_an_object_that_is_no_command_is_an_invalid_transition():
    with pytest.raises(d.InvalidTransition, match="unknown command"):
        d.decide(admitted(), "place it", T0)  # type: ignore[arg-type]


def test_failed_job_records_exit_code_and_reason():
    state = _apply(running(), d.RecordExit("n1", 3, 1.0))
    assert state.status is d.JobStatus.FAILED
    assert state.exit_code == 3
    assert state.last_reasons == ("command exited with code 3",)


def test_quota_is_released_once_after_a_terminal_event():
    done = _apply(running(), d.RecordExit("n1", 0, 1.0))
    released = _apply(done, d.ReleaseQuota(0))
    assert not released.quota_held
    assert d.decide(released, d.ReleaseQuota(0), T0) == ()


def test_an_unchanged_deferral_reason_is_not_recorded_again():
    state = _apply(queued(), d.DeferPlacement(("no room",)))
    assert d.decide(state, d.DeferPlacement(("no room",)), T0) == ()


_commands = st.sampled_from([
    d.ReserveQuota(1, 8), d.Place("n1", (0,), ("u",), "m", "p", "r"), d.RecordStart("n1", 1, T0),
    d.RecordExit("n1", 0, 1.0), d.RecordExit("n1", 2, 1.0), d.ReleaseQuota(0), d.Cancel("c"),
    d.DeferPlacement(("x",)), d.DeferQuota("q"),
])


@given(st.lists(_commands, max_size=12))
def test_replaying_the_events_rebuilds_the_same_state(commands):
    state = admitted()
    history = list(d.decide(d.JobState("j1"), d.RegisterSubmission(SPEC, T0), T0))
    for command in commands:
        try:
            events = d.decide(state, command, T0)
        except d.InvalidTransition:
            continue
        history.extend(events)
        for event in events:
            state = d.evolve(state, event)
    assert d.fold("j1", history) == state
    assert state.version == len(history)
    if state.status in d.TERMINAL:
        assert d.decide(state, d.Cancel("late"), T0) == ()


def test_a_job_on_a_lost_node_is_requeued_once_and_keeps_its_quota():
    state = _apply(running(), d.Requeue("n1", "node lost"))
    assert state.status is d.JobStatus.QUEUED
    assert state.quota_held and state.node_id is None
    assert d.decide(state, d.Requeue("n1", "node lost"), T0) == ()
    assert d.decide(state, d.RecordExit("n1", 137, 1.0), T0) == ()  # a late exit from the lost node


def test_a_requeue_from_another_node_is_ignored():
    assert d.decide(running(), d.Requeue("n2", "node lost"), T0) == ()


# --- gangs ---------------------------------------------------------------------------------------------------


def gang_running(nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> d.JobState:
    members = tuple(d.Member(n, (0, 1), (f"{n}-u0", f"{n}-u1")) for n in nodes)
    state = _apply(queued(), d.Place(nodes[0], (0, 1), members[0].gpu_uuids, "H100-80GB", "bestfit", "fits",
                                     members=members))
    assert state.node_ids == nodes
    return _apply(state, d.RecordStart(nodes[0], 42, T0))


def test_a_gang_succeeds_when_its_last_member_does():
    state = gang_running()
    state = _apply(state, d.RecordExit("n2", 0, 10.0))
    assert state.status is d.JobStatus.RUNNING and state.exited_nodes == ("n2",)
    assert d.decide(state, d.RecordExit("n2", 0, 10.0), T0) == ()  # a repeated report changes nothing
    state = _apply(state, d.RecordExit("n1", 0, 11.0))
    events = d.decide(state, d.RecordExit("n3", 0, 12.0), T0)
    assert [type(e) for e in events] == [ev.JobSucceeded]


def test_a_gang_fails_when_any_member_fails_and_says_which():
    state = _apply(gang_running(), d.RecordExit("n1", 0, 10.0))
    (failed,) = d.decide(state, d.RecordExit("n3", 2, 11.0), T0)
    assert isinstance(failed, ev.JobFailed)
    assert failed.reason == "gang member 2 on n3: command exited with code 2; the other members are stopped"


def test_a_gang_is_preempted_once_every_member_stopped():
    state = _apply(gang_running(("n1", "n2")), d.RequestPreemption("hp", 100, "t", "for hp", 30.0, T0))
    state = _apply(state, d.RecordExit("n2", 143, 5.0))
    assert state.status is d.JobStatus.PREEMPTING
    (preempted,) = d.decide(state, d.RecordExit("n1", 143, 5.0), T0)
    assert isinstance(preempted, ev.JobPreempted)
    assert d.evolve(state, preempted).node_ids == ()


def test_a_lost_member_node_requeues_the_whole_gang_and_reports_from_elsewhere_are_ignored():
    state = gang_running()
    assert d.decide(state, d.RecordExit("n9", 0, 1.0), T0) == ()
    (requeued,) = d.decide(state, d.Requeue("n2", "node lost"), T0)
    assert isinstance(requeued, ev.JobRequeued)
    state = d.evolve(state, requeued)
    assert state.status is d.JobStatus.QUEUED and state.node_ids == ()
