from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_core.quota import FairShareOrder, PendingJob, QuotaAsk, QuotaSnapshot, build_queues, gpus_to_units
from gpusched_core.quota.backfill import FairBackfill
from gpusched_simulation.queue.cluster import FLAVOR, Cluster, gang_parts, gang_shape
from gpusched_simulation.queue.metrics import jain, per_window, water_fill
from gpusched_simulation.queue.quota import QuotaSetup, apportion, tenancy_for
from gpusched_simulation.queue.state import PRIORITY_CLASS
from gpusched_simulation.traces.philly import busy_start, window


@pytest.mark.parametrize("total, weights, expected", [
    (512, {"a": 64, "b": 32, "c": 0}, {"a": 341, "b": 171, "c": 0}),
    (10, {"a": 1, "b": 1, "c": 1}, {"a": 4, "b": 3, "c": 3}),
    (8, {}, {}),
], ids=["nodes", "ties-by-name", "empty"])
def test_quota_is_apportioned_in_whole_gpus(total, weights, expected):
    assert apportion(total, weights) == expected


def test_the_default_window_skips_the_sparse_head_of_the_trace():
    rows = [(datetime(2017, 9, 4, 10), 5.0, 1, "a")] + [(datetime(2017, 9, 24, h % 24), 5.0, 1, "a")
                                                         for h in range(120)]
    start = busy_start(rows)
    assert start == datetime(2017, 9, 24)
    workload = window(rows, start, 7)
    assert len(workload.jobs) == 120 and workload.jobs[0].job_id == "p000001"


def test_a_gang_is_the_fewest_equal_members_that_fit_a_node():
    assert gang_shape(12, 8) == (2, 6) and gang_shape(32, 8) == (4, 8) and gang_shape(3, 8) == (1, 3)
    assert gang_parts(24, 8) == (8, 8, 8)


def test_a_gang_is_placed_on_distinct_nodes_or_not_at_all():
    cluster = Cluster(3, 8)
    assert cluster.place("small", 1) is not None
    assert cluster.place("gang", 24) is None and cluster.free_total == 23
    bindings = cluster.place("gang", 16)
    assert bindings is not None and len({b.node for b in bindings}) == 2
    cluster.release("gang", bindings)
    assert cluster.free_total == 23


@given(st.lists(st.tuples(st.integers(1, 8), st.booleans()), max_size=40))
def test_no_gpu_is_ever_granted_twice(ops):
    cluster = Cluster(4, 8)
    held = {}
    for i, (gpus, release) in enumerate(ops):
        if release and held:
            job, bindings = held.popitem()
            cluster.release(job, bindings)
        elif (bindings := cluster.place(f"j{i}", gpus)) is not None:
            held[f"j{i}"] = bindings
        granted = [(b.node, i) for bs in held.values() for b in bs for i in b.gpu_indices]
        assert len(granted) == len(set(granted))
        assert cluster.free_total == 32 - len(granted) == sum(cluster.free)
        assert set(cluster.snapshot.allocations) == set(held)


def test_per_window_integrates_intervals_exactly():
    assert list(per_window([(0, 5400, 2), (1800, 3600, 1)], 2, 3600)) == [3600 * 2 + 1800, 1800 * 2]


def test_water_fill_gives_idle_share_to_those_who_want_more():
    shares = water_fill(100, {"a": 10, "b": 200, "c": 200}, {"a": 1, "b": 1, "c": 2})
    assert shares == pytest.approx({"a": 10, "b": 30, "c": 60})


def test_jain_is_one_when_equal_and_one_over_n_when_one_takes_all():
    assert jain([2, 2, 2]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def _pending(job_id: str, tenant: str, gpus: int) -> PendingJob:
    return PendingJob(job_id, tenant, QuotaAsk(((FLAVOR, gpus_to_units(gpus)),)), PRIORITY_CLASS, 0.0)


def test_fair_backfill_counts_what_a_tenant_was_given_earlier_in_the_same_cycle():
    # t1 (entitled 15.75 of 18) holds 6 and waits for room for 4: nobody may backfill past 1.5 x 10 / 15.75 =
    # 0.95 of its share. t2 (entitled 2.25) holds nothing: its first GPU keeps it at 0.44, its third takes it
    # to 1.33 even though the cycle's own shares still say 0
    tenancy = tenancy_for(QuotaSetup({"t1": 14, "t2": 2, "t3": 2}, 16), 0.0)
    usage = {"t1": {FLAVOR: gpus_to_units(6)}}
    waiting = [_pending("t1-b", "t1", 4), _pending("t1-c", "t1", 6), *(_pending(f"t2-{i}", "t2", 1) for i in range(8))]
    queues = build_queues(tenancy, waiting, FairShareOrder())
    backfill = FairBackfill(QuotaSnapshot(tenancy, usage), queues, 0.5)
    backfill.blocked(waiting[0])
    given = []
    for job in waiting[2:]:
        if not backfill.holds_back(job, FLAVOR, job.ask.units):
            backfill.started(job.tenant, FLAVOR, job.ask.units)
            given.append(job.job_id)
    assert given == ["t2-0", "t2-1"]
    assert not backfill.holds_back(waiting[1], FLAVOR, waiting[1].ask.units)  # the blocked tenant's own work is not held back by its block
