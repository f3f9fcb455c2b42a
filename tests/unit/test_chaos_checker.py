"""The fault campaign's pure parts: its seeded schedule and its checker (libs/cli/gpusched_cli/chaos)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_cli.chaos import schedule as sch
from gpusched_cli.chaos.checker import (
    JobFact, QuotaLimits, QuotaPoint, Run, double_allocated_seconds, double_runs, lost_and_stuck, percentile,
    quota_held_at_end, quota_overshoot, stale_reports,
)
from gpusched_cli.chaos.collect import quota_limits
from gpusched_cli.chaos.workload import tenancy

TARGETS = sch.Targets(services=("admission", "placement", "placement-2", "gateway"), replicas=("placement-2",),
                      consumers=("placement", "placement-2"), relays=("placement",), agents=("agent-node-1",))
TIMING = sch.Timing(lease_s=8, grace_s=2, session_s=3)


def run(job="j", attempt=1, node="n1", pid=1, start=0.0, until=1.0, code=0, devices=("g0",), share=None) -> Run:
    return Run(job, attempt, node, pid, start, until, code, devices, share)


def test_a_schedule_as_long_as_the_kinds_has_each_once_and_a_seed_gives_the_same_one():
    faults = sch.make_schedule(3, len(sch.KINDS), TARGETS, TIMING)
    assert sorted(f.kind for f in faults) == sorted(sch.KINDS)
    assert faults == sch.make_schedule(3, len(sch.KINDS), TARGETS, TIMING)
    assert faults != sch.make_schedule(4, len(sch.KINDS), TARGETS, TIMING)


@given(st.integers(0, 10_000), st.integers(len(sch.KINDS), 60))
def test_every_kind_appears_pauses_outlast_the_lease_and_targets_fit_the_kind(seed, count):
    faults = sch.make_schedule(seed, count, TARGETS, TIMING)
    assert len(faults) == count and set(sch.KINDS) <= {f.kind for f in faults}
    for fault in faults:
        if fault.kind == sch.PAUSE_AGENT:
            assert fault.duration_s > TIMING.lease_s + TIMING.grace_s and fault.target in TARGETS.agents
        if fault.kind == sch.PAUSE_SERVICE:
            assert fault.duration_s > TIMING.lease_s
        if fault.kind == sch.CONSUMER_STALL:
            assert fault.duration_s > TIMING.session_s and fault.target in TARGETS.consumers
        if fault.kind == sch.CLOCK_SKEW:
            assert fault.target in TARGETS.replicas


def test_lost_and_stuck_jobs():
    facts = {"a": JobFact("a", "Succeeded"), "b": JobFact("b", "Running"), "c": JobFact("c", None)}
    assert lost_and_stuck(["a", "b", "c", "d"], facts) == (["c", "d"], ["b"])


@pytest.mark.parametrize("runs, nodes, doubles", [
    pytest.param([run(attempt=1, until=5), run(attempt=2, pid=2, start=6, until=8)], 1, 0, id="one after another"),
    pytest.param([run(attempt=1, until=5), run(attempt=2, node="n2", pid=2, start=4, until=8)], 1, 1,
                 id="a requeued run started while the first still ran"),
    pytest.param([run(attempt=1, until=5), run(attempt=1, node="n2", pid=2, start=0.1, until=5)], 2, 0,
                 id="a gang's members run together"),
    pytest.param([run(attempt=1, until=5), run(attempt=1, node="n2", pid=2, start=0.1, until=5)], 1, 1,
                 id="a one-node job on two nodes at once"),
    pytest.param([run(attempt=1, until=5), run(attempt=1, pid=2, start=1, until=5)], 2, 1,
                 id="one attempt started twice on one node"),
])
def test_double_runs(runs, nodes, doubles):
    assert len(double_runs(runs, {"j": JobFact("j", "Succeeded", nodes=nodes)})) == doubles


def test_double_allocation_counts_whole_gpus_and_shares_beyond_the_gpu():
    whole = [run(job="a", start=0, until=10), run(job="b", start=6, until=12)]
    assert double_allocated_seconds(whole)[0] == 4.0
    shares = [run(job="a", share=500, until=10), run(job="b", share=500, until=10), run(job="c", share=250, start=8,
                                                                                         until=10)]
    assert double_allocated_seconds(shares)[0] == 2.0
    other_nodes = [run(job="a", until=10), run(job="b", node="n2", until=10)]
    assert double_allocated_seconds(other_nodes)[0] == 0.0
    back_to_back = [run(job="a", until=5), run(job="b", start=5, until=9)]
    assert double_allocated_seconds(back_to_back)[0] == 0.0


def test_quota_overshoot_per_tenant_and_cohort():
    limits = quota_limits(tenancy(whole_gpus=10, mig_gpus=10, probe_gpus=2))
    assert limits.tenants[("team-b", "H100-80GB")] == 5.0 and limits.tenants[("team-c", "H100-80GB")] == 3.5 and limits.tenants[("team-a", "H100-80GB")] == 10.0
    ok = [QuotaPoint(1, "team-b", "H100-80GB", 5), QuotaPoint(2, "team-a", "H100-80GB", 5)]
    assert quota_overshoot(ok, limits) == (0, [])
    over = [QuotaPoint(1, "team-b", "H100-80GB", 6, "j-b"), QuotaPoint(2, "team-a", "H100-80GB", 5, "j-a")]
    units, examples = quota_overshoot(over, limits)
    assert units == 1000 + 1000 and len(examples) == 2  # team-b past its limit, the cohort past its total
    assert "job j-b" in examples[0] and "team-a 5, team-b 6" in examples[1]  # the event, and who held what
    released = [QuotaPoint(1, "team-a", "H100-80GB", 8), QuotaPoint(2, "team-a", "H100-80GB", 0),
                QuotaPoint(3, "team-b", "H100-80GB", 5)]
    assert quota_overshoot(released, QuotaLimits(limits.tenants, limits.cohorts, limits.cohort_of))[0] == 0


def test_quota_still_reserved_once_every_job_ended_is_a_lost_release():
    limits = quota_limits(tenancy(whole_gpus=10, mig_gpus=10, probe_gpus=2))
    assert quota_held_at_end([("team-a", "H100-80GB", 0), ("team-b", "A100-80GB", 0)], limits) == (0, [])
    units, examples = quota_held_at_end([("team-a", "H100-80GB", 3500), ("someone", "H100-80GB", 7000)], limits)
    assert units == 500 and examples == ["team-a: 0.5 H100-80GB still reserved at the end"]  # of the cohort's only


def test_a_recorded_end_its_last_run_did_not_make_is_a_stale_report():
    facts = {"a": JobFact("a", "Succeeded", attempts=2, end_exit_code=0, end_nodes=("n1",)),
             "b": JobFact("b", "Succeeded", attempts=1, end_exit_code=0, end_nodes=("n1",)),
             "c": JobFact("c", "Failed", attempts=1, end_exit_code=137, end_nodes=("n1",))}
    runs = [run(job="a", attempt=1, code=0), run(job="a", attempt=2, pid=2, code=None),
            run(job="b", attempt=1, code=0), run(job="c", attempt=1, code=None)]
    assert [s.split(":")[0] for s in stale_reports(runs, facts)] == ["a"]  # attempt 2 was killed, not exit 0


def test_a_gang_failed_by_one_member_is_judged_by_that_member_s_run_not_by_the_members_stopped_for_it():
    """Found by the campaign (seed 1): a gang whose member on node-1 exited 3 had its member on node-2
    stopped (killed); the end names node-1, and that run did exit 3: no stale report."""
    import json

    from gpusched_cli.chaos.collect import fold

    def row(position: int, kind: str, **payload) -> dict:
        return {"global_position": position, "stream_id": "job-g", "type": kind, "payload": json.dumps(payload)}

    rows = [row(1, "JobSubmitted", spec={"nodes": 2}),
            row(2, "JobPlaced", node_id="node-2", members=[{"node_id": "node-2"}, {"node_id": "node-1"}],
                node_ids=["node-2", "node-1"]),
            row(3, "JobFailed", node_id="node-1", exit_code=3)]
    facts, _ = fold(rows, {"g": "Failed"}, ["g"])
    assert facts["g"].end_nodes == ("node-1",) and facts["g"].nodes == 2
    runs = [run(job="g", attempt=1, node="node-1", code=3), run(job="g", attempt=1, node="node-2", pid=2, code=None)]
    assert stale_reports(runs, facts) == []
    lying = {"g": JobFact("g", "Failed", nodes=2, attempts=1, end_exit_code=3, end_nodes=("node-2",))}
    assert len(stale_reports(runs, lying)) == 1  # had node-2's stopped member been believed to exit 3


def test_percentiles_by_nearest_rank():
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_an_acknowledgement_at_or_below_the_highest_before_is_a_lost_log():
    from types import SimpleNamespace as Ack

    from gpusched_common.ack_offsets import AckOffsets

    offsets = AckOffsets()
    assert offsets.note([Ack(topic="t", partition=0, offset=0), Ack(topic="t", partition=0, offset=1),
                         Ack(topic="t", partition=1, offset=0)]) == []
    assert offsets.note([Ack(topic="t", partition=1, offset=1)]) == []
    assert offsets.note([Ack(topic="t", partition=0, offset=1)]) == ["t:0 (offset 1 before, 1 now)"]  # a new log
    # the same loss, seen later on another partition, is not reported again: its republish covered it
    assert offsets.note([Ack(topic="t", partition=1, offset=0)]) == []
    assert offsets.note([Ack(topic="t", partition=1, offset=0)]) == ["t:1 (offset 0 before, 0 now)"]  # another
    assert offsets.note([Ack(topic="t", partition=0, offset=2), Ack(topic="t", partition=0, offset=0)]) \
        == ["t:0 (offset 2 before, 0 now)"]
    assert offsets.note([object(), Ack(topic="t", partition=0, offset=-1)]) == []  # not acknowledgements: ignored
