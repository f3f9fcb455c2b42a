"""The node agent's decision core (gpusched_core.agent): whether a StartJob starts, is refused or is ignored;
preemptions; the GPU fault policy; the errors of the stops the agent causes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_core.agent import reconcile as rc
from gpusched_common.events import ExitReason
from gpusched_core.agent.start import (
    DUPLICATE, RECORD_GONE, RUN_NOT_OVER, STALE, Ignore, NodeFacts, PreviousRun, Refuse, Start, decide_start,
)
from gpusched_core.agent.stops import (
    ALREADY_ENDED, ALREADY_STOPPING, NOT_HERE, FaultResponse, Preempt, decide_gpu_fault, decide_preempt, stop_error,
)

T0 = datetime(2025, 1, 1, tzinfo=timezone.utc)


def a_node(lease_valid: bool = True, unhealthy: tuple[int, ...] = ()) -> NodeFacts:
    return NodeFacts("n1", lease_valid, frozenset(unhealthy))


def ran(attempt: int | None, reported: bool = True) -> PreviousRun:
    return PreviousRun(attempt, reported)


@pytest.mark.parametrize("attempt, gpus, previous, node, expected", [
    pytest.param(1, (0,), None, a_node(), Start(), id="a job new to the node starts"),
    pytest.param(1, (0,), ran(1, reported=False), a_node(), Ignore(DUPLICATE),
                 id="a redelivered StartJob of the running attempt is ignored"),
    pytest.param(1, (0,), ran(1), a_node(), Ignore(DUPLICATE),
                 id="a redelivered StartJob of an attempt that ended is ignored"),
    pytest.param(1, (0,), ran(2), a_node(), Ignore(STALE), id="an earlier attempt than the one recorded is stale"),
    pytest.param(2, (0,), ran(1, reported=False), a_node(), Ignore(RUN_NOT_OVER),
                 id="a later attempt waits for the recorded run's exit to be reported"),
    pytest.param(2, (0,), ran(None), a_node(), Ignore(RECORD_GONE),
                 id="a record that vanished while read starts nothing"),
    pytest.param(2, (0,), PreviousRun(1, reported=True, alive=True), a_node(), Ignore(RUN_NOT_OVER),
                 id="a later attempt waits for a run marked reported whose process still runs"),
    pytest.param(2, (0,), ran(1), a_node(), Start(rerun=True),
                 id="a later attempt after a reported run starts again and sets the old run aside"),
    pytest.param(1, (0,), None, a_node(lease_valid=False),
                 Refuse(ExitReason.LEASE_LOST, "n1 has lost its lease; the job was not started"),
                 id="nothing starts while the lease is fenced"),
    pytest.param(2, (0,), ran(1), a_node(lease_valid=False),
                 Refuse(ExitReason.LEASE_LOST, "n1 has lost its lease; the job was not started", rerun=True),
                 id="a fenced rerun is refused after the old run is set aside"),
    pytest.param(1, (3, 1, 2), None, a_node(unhealthy=(1, 3)),
                 Refuse(ExitReason.GPU_UNHEALTHY, "GPU(s) [3, 1] on n1 are unhealthy; the job was not started"),
                 id="a job asking for cordoned GPUs is refused naming them in its order"),
    pytest.param(1, (0,), None, a_node(lease_valid=False, unhealthy=(0,)),
                 Refuse(ExitReason.LEASE_LOST, "n1 has lost its lease; the job was not started"),
                 id="a lost lease is the reason before an unhealthy GPU"),
    pytest.param(1, (0, 1), None, a_node(unhealthy=(2,)), Start(), id="an unhealthy GPU the job does not use is no bar"),
    pytest.param(1, (0,), ran(1, reported=False), a_node(lease_valid=False), Ignore(DUPLICATE),
                 id="a duplicate is ignored even when fenced: nothing is reported twice"),
])
def test_start_table(attempt, gpus, previous, node, expected):
    assert decide_start(attempt=attempt, gpu_indices=gpus, previous=previous, node=node) == expected


previous_runs = st.one_of(st.none(), st.builds(PreviousRun, st.one_of(st.none(), st.integers(1, 4)), st.booleans(),
                                                st.booleans()))
nodes = st.builds(NodeFacts, st.just("n1"), st.booleans(), st.frozensets(st.integers(0, 7)))


@given(st.integers(1, 4), st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True), previous_runs, nodes)
def test_a_job_never_runs_twice_and_nothing_starts_on_a_fenced_node_or_a_cordoned_gpu(attempt, gpus, previous, node):
    decision = decide_start(attempt=attempt, gpu_indices=gpus, previous=previous, node=node)
    assert decision == decide_start(attempt=attempt, gpu_indices=gpus, previous=previous, node=node)
    acts = not isinstance(decision, Ignore)
    # a run recorded here that is not over, or not older, is never replaced nor reported on
    new_run = previous is None or (previous.attempt is not None and attempt > previous.attempt and previous.reported
                                   and not previous.alive)
    assert acts == new_run
    if isinstance(decision, Start):
        assert node.lease_valid and not set(gpus) & node.unhealthy_gpus
    if acts:
        assert decision.rerun == (previous is not None)
        if not node.lease_valid:
            assert decision == Refuse(ExitReason.LEASE_LOST, decision.error, decision.rerun)


@pytest.mark.parametrize("known, reported, stopping, deadline_in_s, expected", [
    pytest.param(True, False, False, 5.0, Preempt(5.0), id="a running job gets what is left until the deadline"),
    pytest.param(True, False, False, -3.0, Preempt(0.0), id="a deadline already past means no grace"),
    pytest.param(False, False, False, 5.0, Ignore(NOT_HERE), id="a job never started here is not preempted"),
    pytest.param(True, True, False, 5.0, Ignore(ALREADY_ENDED), id="a job that ended and was reported is left"),
    pytest.param(True, False, True, 5.0, Ignore(ALREADY_STOPPING), id="a redelivered PreemptJob stops nothing twice"),
])
def test_preempt_table(known, reported, stopping, deadline_in_s, expected):
    assert decide_preempt(known=known, reported=reported, stopping=stopping,
                          deadline_at=T0 + timedelta(seconds=deadline_in_s), now=T0) == expected


RUNNING = {"j2": (1,), "j1": (0, 1), "j3": (2,)}


@pytest.mark.parametrize("gpu, healthy, policy, expected", [
    pytest.param(1, False, "stop", FaultResponse(("j1", "j2"), "stopped"), id="policy stop stops the GPU's jobs"),
    pytest.param(1, False, "keep", FaultResponse(("j1", "j2"), "kept"), id="policy keep keeps them and says so"),
    pytest.param(1, True, "stop", FaultResponse(("j1", "j2"), None), id="a GPU that recovered lists its jobs only"),
    pytest.param(5, False, "stop", FaultResponse((), None), id="a failed GPU without jobs stops nothing"),
])
def test_gpu_fault_table(gpu, healthy, policy, expected):
    response = decide_gpu_fault(gpu_index=gpu, healthy=healthy, job_gpus=RUNNING, policy=policy)
    assert response == expected
    assert response.to_stop == (expected.job_ids if expected.job_action == "stopped" else ())


@pytest.mark.parametrize("reason, expected", [
    pytest.param(ExitReason.GPU_UNHEALTHY, "stopped by n1: GPU 1: XID 79 (GPU fell off the bus); hot", id="names the sick GPUs"),
    pytest.param(ExitReason.LEASE_LOST, "stopped by n1: node lease (epoch 4) expired", id="names the lost epoch"),
    pytest.param(ExitReason.STOPPED, None, id="a stop asked for carries no error"),
    pytest.param(None, None, id="a job's own exit carries no error"),
])
def test_stop_errors(reason, expected):
    unhealthy = {1: ("XID 79 (GPU fell off the bus)", "hot"), 3: ("XID 48",)}
    assert stop_error(reason, node_id="n1", gpu_indices=(0, 1), lease_epoch=4, unhealthy_reasons=unhealthy) == expected


def test_a_gpu_stop_whose_gpus_recovered_still_says_why():
    assert stop_error(ExitReason.GPU_UNHEALTHY, node_id="n1", gpu_indices=(0,), lease_epoch=1,
                      unhealthy_reasons={}) == "stopped by n1: GPU unhealthy"


@pytest.mark.parametrize("answer, epoch, expected", [(None, 3, False), (3, 3, True), (2, 3, False)],
                         ids=["an answer naming no epoch", "an answer to this epoch", "an answer to an older epoch"])
def test_reconcile_answers_only_the_current_epoch(answer, epoch, expected):
    assert rc.answers_epoch(answer, epoch) is expected
