"""The scale-decision core: hysteresis, cooldowns, node counts, and no flapping under noisy input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_common import events as ev

from gpusched_core.metrics.scaling import (
    ScalePolicy, ScalerState, nodes_to_pack, observe, plan_scaling,
)
from tests.unit.metrics.builders import at, cluster

POLICY = ScalePolicy(window_s=60, clear_s=15, cooldown_s=300, max_nodes=16, scale_in_idle_s=600,
                     scale_in_cooldown_s=300, min_nodes=0, provision_timeout_s=900)


def full_h100_cluster_with_burst(jobs: int = 10, gpus: int = 4):
    b = cluster().nodes("H100-80GB", 2)
    for node in ("n-h100-1", "n-h100-2"):
        b.fill(node)
    for j in range(jobs):
        b.pending(f"burst-{j}", gpus, "H100-80GB")
    return b.build()


def run(snapshots, times, policy=POLICY, state=ScalerState()):
    decisions = []
    for snapshot, t in zip(snapshots, times, strict=True):
        state, new = plan_scaling(state, observe(snapshot), at(t), policy)
        decisions += [(t, d) for d in new]
    return state, decisions


def test_first_fit_decreasing_counts_the_nodes_a_burst_needs():
    assert nodes_to_pack((4,) * 10, 8) == 5
    assert nodes_to_pack((5, 5, 5), 8) == 3  # not ceil(15 / 8) = 2
    assert nodes_to_pack((6, 2, 3, 3, 2), 8) == 2
    assert nodes_to_pack((9,), 8) == 0  # no node of this size could take it


def test_a_burst_with_no_free_capacity_gives_exactly_one_scale_out_with_the_right_node_count():
    snapshot = full_h100_cluster_with_burst(jobs=10, gpus=4)
    _, decisions = run([snapshot] * 40, range(0, 400, 10))
    assert len(decisions) == 1
    t, out = decisions[0]
    assert isinstance(out, ev.ScaleOutRequested) and t == 60
    assert (out.gpu_model, out.nodes, out.unplaceable_gpus, out.free_gpus, out.gpus_per_node) == ("H100-80GB", 5, 40, 0, 8)
    assert "10 pending request(s) for 40 H100-80GB GPU(s)" in out.reason


def test_demand_shorter_than_the_window_scales_nothing():
    busy, calm = full_h100_cluster_with_burst(), full_h100_cluster_with_burst(jobs=0)
    snapshots = ([busy] * 5 + [calm] * 3) * 5  # 50 s of pressure, then 30 s clear, repeated
    _, decisions = run(snapshots, range(0, 400, 10))
    assert [d for _, d in decisions if isinstance(d, ev.ScaleOutRequested)] == []


def test_a_dip_shorter_than_the_clear_time_does_not_reset_the_window():
    busy, calm = full_h100_cluster_with_burst(), full_h100_cluster_with_burst(jobs=0)
    snapshots = [busy] * 4 + [calm] + [busy] * 4  # a 10 s dip (clear_s is 15)
    _, decisions = run(snapshots, range(0, 90, 10))
    assert [t for t, d in decisions if isinstance(d, ev.ScaleOutRequested)] == [60]


def test_nodes_in_flight_are_not_requested_again_after_the_cooldown():
    snapshot = full_h100_cluster_with_burst(jobs=10, gpus=4)
    state, decisions = run([snapshot] * 100, range(0, 1000, 10))
    outs = [(t, d.nodes) for t, d in decisions if isinstance(d, ev.ScaleOutRequested)]
    # the 5 nodes never arrive: after the provision timeout (900 s) they are asked for again
    assert outs == [(60, 5), (960, 5)]


def test_arrived_nodes_end_the_pressure():
    before = full_h100_cluster_with_burst(jobs=2, gpus=8)
    after = cluster().nodes("H100-80GB", 4).fill("n-h100-1").fill("n-h100-2").fill("n-h100-3").fill("n-h100-4").build()
    _, decisions = run([before] * 7 + [after] * 60, range(0, 670, 10))
    assert [(t, d.nodes) for t, d in decisions if isinstance(d, ev.ScaleOutRequested)] == [(60, 2)]


def test_idle_nodes_get_scale_in_after_the_idle_time_once_each_and_not_below_the_minimum():
    snapshot = cluster().nodes("A100-80GB", 3).fill("n-a100-1").build()
    policy = ScalePolicy(**{**POLICY.__dict__, "min_nodes": 1})
    _, decisions = run([snapshot] * 100, range(0, 1000, 10), policy)
    ins = [(t, d.node_id) for t, d in decisions if isinstance(d, ev.ScaleInRequested)]
    assert ins == [(600, "n-a100-2"), (600, "n-a100-3")]
    policy_min2 = ScalePolicy(**{**POLICY.__dict__, "min_nodes": 2})
    _, decisions = run([snapshot] * 100, range(0, 1000, 10), policy_min2)
    assert [d.node_id for _, d in decisions] == ["n-a100-2"]


def test_pending_work_for_the_model_blocks_scale_in():
    snapshot = cluster().nodes("A100-80GB", 2).fill("n-a100-1").pending("j", 8, "A100-80GB", reserved=False).build()
    _, decisions = run([snapshot] * 100, range(0, 1000, 10))
    assert not any(isinstance(d, ev.ScaleInRequested) for _, d in decisions)


def test_after_a_burst_drains_idle_nodes_scale_in_only_after_the_cooldown():
    burst = full_h100_cluster_with_burst(jobs=2, gpus=8)
    drained = cluster().nodes("H100-80GB", 4).build()  # the new nodes came, the work finished
    state, decisions = run([burst] * 7, range(0, 70, 10))
    state, later = run([drained] * 100, range(70, 1070, 10), state=state)
    outs = [t for t, d in decisions if isinstance(d, ev.ScaleOutRequested)]
    ins = [(t, d.node_id) for t, d in later if isinstance(d, ev.ScaleInRequested)]
    assert outs == [60]
    assert {n for _, n in ins} == {"n-h100-1", "n-h100-2", "n-h100-3", "n-h100-4"}
    assert min(t for t, _ in ins) >= 60 + POLICY.cooldown_s


noisy_pending = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), min_size=1, max_size=120)


@settings(max_examples=60, deadline=None)
@given(noisy_pending)
def test_noisy_demand_never_flaps(trace):
    """Random pending bursts and random busy nodes: decisions for a model in opposite directions are
    always at least the cooldown apart, scale-outs at least the cooldown apart, and no node is named twice
    while it stays idle."""
    snapshots = []
    for jobs, busy_nodes in trace:
        b = cluster().nodes("H100-80GB", 3)
        for n in range(1, busy_nodes + 1):
            b.fill(f"n-h100-{n}")
        for j in range(jobs):
            b.pending(f"j{j}", 4, "H100-80GB")
        snapshots.append(b.build())
    _, decisions = run(snapshots, range(0, 10 * len(snapshots), 10),
                       ScalePolicy(window_s=30, clear_s=15, cooldown_s=120, scale_in_idle_s=60,
                                   scale_in_cooldown_s=60, provision_timeout_s=300))
    last: dict[str, float] = {}
    for t, d in decisions:
        kind = "out" if isinstance(d, ev.ScaleOutRequested) else "in"
        other = "in" if kind == "out" else "out"
        if other in last:
            assert t - last[other] >= 120, decisions
        if kind == "out" and "out" in last:
            assert t - last["out"] >= 120, decisions
        last[kind] = t
        if isinstance(d, ev.ScaleOutRequested):
            assert 1 <= d.nodes <= 16
    ins = [(t, d.node_id) for t, d in decisions if isinstance(d, ev.ScaleInRequested)]
    assert all(isinstance(n, str) for _, n in ins)


def test_the_plan_is_deterministic():
    snapshot = full_h100_cluster_with_burst()
    assert run([snapshot] * 10, range(0, 100, 10)) == run([snapshot] * 10, range(0, 100, 10))
