from __future__ import annotations

from datetime import timedelta

import pytest

from gpusched_core.placement.leases import NodeLease, is_stale, select_expired
from tests.builders import T0


def lease(node: str, silent_s: float, ttl: float = 30, grace: float = 10, lost: bool = False) -> NodeLease:
    return NodeLease(node, 3, T0 - timedelta(seconds=silent_s), ttl, grace, lost)


@pytest.mark.parametrize(("node", "expired"), [
    pytest.param(lease("n", 39), False, id="within-ttl-plus-grace"),
    pytest.param(lease("n", 41), True, id="past-ttl-plus-grace"),
    pytest.param(lease("n", 500, ttl=0), False, id="no-lease-held"),
    pytest.param(lease("n", 500, lost=True), False, id="already-lost"),
])
def test_expiry(node, expired):
    assert (select_expired([node], T0) == [node]) is expired


def test_expired_nodes_come_in_node_order():
    assert [n.node_id for n in select_expired([lease("b", 60), lease("a", 60)], T0)] == ["a", "b"]


@pytest.mark.parametrize(("report", "lost", "stale"), [
    (3, 3, True), (2, 3, True), (4, 3, False), (None, 3, False), (3, None, False),
])
def test_reports_from_a_lost_epoch_are_stale(report, lost, stale):
    assert is_stale(report, lost) is stale
