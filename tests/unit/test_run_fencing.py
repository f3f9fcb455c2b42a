"""Fencing at run level: a StartJob carries the node's lease epoch when the run was placed, and an agent at
another epoch ignores it; a report names its run, and placement ignores reports of another run or of a
node the job is not on; a ReconcileJobs is taken only for the agent's current epoch."""

from __future__ import annotations

import pytest

from gpusched_core.agent import reconcile as rc
from gpusched_core.agent.start import OTHER_EPOCH, Ignore, NodeFacts, Start, decide_start
from gpusched_core.placement.leases import other_run

NODE = NodeFacts("n1", lease_valid=True, unhealthy_gpus=(), lease_epoch=4)


@pytest.mark.parametrize("placed_at, decision", [(4, Start()), (None, Start()), (3, Ignore(OTHER_EPOCH)),
                                                 (5, Ignore(OTHER_EPOCH))])
def test_a_start_placed_for_another_epoch_is_ignored(placed_at, decision):
    assert decide_start(attempt=1, gpu_indices=[0], previous=None, node=NODE, lease_epoch=placed_at) == decision


@pytest.mark.parametrize("node_ids, runs, node, attempt, why", [
    (("n1",), 2, "n1", 2, None),
    (("n1",), 2, "n1", None, None),
    (("n1", "n2"), 1, "n2", 1, None),
    (("n1",), 2, "n1", 1, "attempt 1 is not the job's current run (2)"),
    (("n1",), 2, "n9", 2, "the job does not run on n9"),
    ((), 0, "n1", None, "the job does not run on n1"),
    ((), 1, "n1", 1, None),  # the final checkpoint of a run whose preemption was recorded first
    ((), 2, "n1", 1, "attempt 1 is not the job's current run (2)"),
])
def test_reports_of_another_run_or_node_are_not_the_job_s(node_ids, runs, node, attempt, why):
    assert other_run(node_ids, runs, node, attempt) == why


def test_a_reconcile_naming_no_epoch_stops_nothing():
    assert not rc.answers_epoch(None, 4) and rc.answers_epoch(4, 4) and not rc.answers_epoch(3, 4)
