from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_core import placement as engine
from gpusched_core.placement.cycle import PendingPlacement, request_for, shape_of
from gpusched_core.placement.cycle import GpuRow, Held, NodeRow, build_cluster, plan_cycle


def a_node(node_id: str, gpus: int = 8, model: str = "H100-80GB", unhealthy: tuple[int, ...] = ()) -> NodeRow:
    return NodeRow(node_id, 64_000, 512_000, tuple(
        GpuRow(i, f"{node_id}-u{i}", model, 81559, i not in unhealthy) for i in range(gpus)), {})


def job(job_id: str, gpus: int, model: str | None = None, priority: int = 0, seq: int = 0) -> PendingPlacement:
    return PendingPlacement(job_id, gpus, model, priority, seq)


@pytest.fixture(scope="module")
def bestfit():
    return engine.make_policy("bestfit")


def test_bestfit_fills_the_fuller_node_first(bestfit):
    nodes = [a_node("n1"), a_node("n2")]
    snapshot = build_cluster(nodes, {"old": [("n2", i) for i in range(6)]}, {})
    placements, deferrals = plan_cycle(snapshot, [job("j", 2)], bestfit, nodes)
    assert deferrals == [] and placements[0].node_id == "n2"
    assert placements[0].gpu_indices == (6, 7) and placements[0].gpu_uuids == ("n2-u6", "n2-u7")


def test_a_cycle_never_gives_a_gpu_twice_and_defers_with_reasons_per_class(bestfit):
    nodes = [a_node("n1", gpus=4), a_node("n2", gpus=4, model="A100-80GB")]
    snapshot = build_cluster(nodes, {}, {})
    placements, deferrals = plan_cycle(snapshot, [job("a", 4, "H100-80GB", seq=1), job("b", 2, "H100-80GB", seq=2)],
                                       bestfit, nodes)
    assert [p.job_id for p in placements] == ["a"]
    assert deferrals[0].job_id == "b" and deferrals[0].reasons  # why, per class of node


def test_unhealthy_gpus_are_not_used(bestfit):
    nodes = [a_node("n1", gpus=2, unhealthy=(0,))]
    placements, _ = plan_cycle(build_cluster(nodes, {}, {}), [job("j", 1)], bestfit, nodes)
    assert placements[0].gpu_indices == (1,)


def test_nominated_gpus_go_to_their_preemptor_only(bestfit):
    nodes = [a_node("n1", gpus=2)]
    snapshot = build_cluster(nodes, {}, {"hp": [("n1", 0), ("n1", 1)]})
    placements, deferrals = plan_cycle(snapshot, [job("small", 1, priority=5, seq=1), job("hp", 2, seq=2)],
                                       bestfit, nodes)
    assert [p.job_id for p in placements] == ["hp"]
    assert [d.job_id for d in deferrals] == ["small"]


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2)), max_size=25), st.integers(1, 3))
def test_cycles_are_deterministic_and_within_capacity(jobs, node_count):
    policy = engine.make_policy("bestfit")
    nodes = [a_node(f"n{i}") for i in range(node_count)]
    work = [job(f"j{i}", g, None, p, i) for i, (g, p) in enumerate(jobs)]
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), work, policy, nodes)
    used = [(p.node_id, i) for p in placements for i in p.gpu_indices]
    assert len(used) == len(set(used)) and len(placements) + len(deferrals) == len(work)
    assert plan_cycle(build_cluster(nodes, {}, {}), list(reversed(work)), policy, nodes) == (placements, deferrals)


# --- gangs, shares and MIG slices ---------------------------------------------------------------------------


def mig_node(node_id: str, gpus: int = 2, model: str = "A100-80GB") -> NodeRow:
    return NodeRow(node_id, 64_000, 512_000, tuple(
        GpuRow(i, f"{node_id}-u{i}", model, 81920, mig_enabled=True) for i in range(gpus)), {})


def test_a_gang_gets_every_member_or_nothing(bestfit):
    nodes = [a_node("n1"), a_node("n2"), a_node("n3", gpus=4)]
    gang = PendingPlacement("g", 8, None, 0, 1, nodes=2)
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), [gang], bestfit, nodes)
    assert deferrals == []
    members = placements[0].members
    assert [m.node_id for m in members] == ["n1", "n2"] and all(len(m.gpu_indices) == 8 for m in members)
    assert placements[0].node_id == "n1" and placements[0].gpu_uuids[0] == "n1-u0"

    too_big = PendingPlacement("g3", 8, None, 0, 1, nodes=3)
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), [too_big], bestfit, nodes)
    assert placements == [] and deferrals[0].reasons[0].startswith("gang g3: only 2 of 3 members fit")


def test_shares_pack_onto_one_gpu_and_never_exceed_it(bestfit):
    nodes = [a_node("n1", gpus=2)]
    work = [PendingPlacement(f"s{i}", 1, None, 0, i, share_milli=400, share_memory_mib=20_000) for i in range(5)]
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), work, bestfit, nodes)
    per_gpu: dict[int, int] = {}
    for p in placements:
        assert p.share_milli == 400 and p.share_memory_mib == 20_000 and len(p.gpu_indices) == 1
        per_gpu[p.gpu_indices[0]] = per_gpu.get(p.gpu_indices[0], 0) + p.share_milli
    assert len(placements) == 4 and all(v <= 1000 for v in per_gpu.values())  # two per GPU
    assert [d.job_id for d in deferrals] == ["s4"]


def test_held_shares_and_mig_instances_count_in_the_next_cycle(bestfit):
    nodes = [a_node("n1", gpus=1), mig_node("m1", gpus=1)]
    held = {"old-share": [Held("n1", 0, 700, 1000)], "old-mig": [Held("m1", 0, 500, 0, "4g.40gb", 0)]}
    work = [PendingPlacement("whole", 1, None, 0, 1), PendingPlacement("s", 1, None, 0, 2, share_milli=400),
            PendingPlacement("m", 1, None, 0, 3, mig_profile="3g.40gb")]
    placements, deferrals = plan_cycle(build_cluster(nodes, held, {}), work, bestfit, nodes)
    assert [p.job_id for p in placements] == ["m"]  # no whole GPU and no 400 milli left; 3g fits at slice 4
    assert placements[0].mig_start == 4 and placements[0].mig_memory_slices == 4
    assert {d.job_id for d in deferrals} == {"whole", "s"}


def test_mig_slices_only_at_valid_positions(bestfit):
    nodes = [mig_node("m1", gpus=1)]
    work = [PendingPlacement(f"m{i}", 1, "A100-80GB", 0, i, mig_profile="2g.20gb") for i in range(4)]
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), work, bestfit, nodes)
    assert sorted(p.mig_start for p in placements) == [0, 2, 4]  # 2g starts only at 0, 2 and 4
    assert [d.job_id for d in deferrals] == ["m3"]


@given(st.lists(st.sampled_from(["whole", "gang", "share", "mig"]), max_size=20))
def test_mixed_cycles_stay_within_capacity(kinds):
    policy = engine.make_policy("bestfit")
    nodes = [a_node("n1", gpus=4), a_node("n2", gpus=4), mig_node("m1", gpus=2)]
    shapes = {"whole": {}, "gang": {"nodes": 2}, "share": {"share_milli": 300}, "mig": {"mig_profile": "1g.10gb"}}
    work = [PendingPlacement(f"j{i}", 2 if kind == "gang" else 1, None, 0, i, **shapes[kind]) for i, kind in enumerate(kinds)]
    placements, deferrals = plan_cycle(build_cluster(nodes, {}, {}), work, policy, nodes)
    milli: dict[tuple[str, int], int] = {}
    slices: set[tuple[str, int, int]] = set()
    for p in placements:
        for member in p.all_members:
            for index in member.gpu_indices:
                key = (member.node_id, index)
                milli[key] = milli.get(key, 0) + (p.share_milli or (0 if p.mig_profile else 1000))
                if p.mig_profile:
                    taken = {(member.node_id, index, s) for s in range(p.mig_start, p.mig_start + p.mig_memory_slices)}
                    assert not taken & slices
                    slices |= taken
    assert all(v <= 1000 for v in milli.values())
    assert len(placements) + len(deferrals) == len(work)


def test_a_mig_instance_held_for_its_preemptor_goes_to_it_and_a_hold_that_does_not_fit_never_stops_a_load(bestfit):
    """A reclaim for a MIG job holds the slice its victim frees; a hold recorded as a whole GPU on a MIG GPU
    (before migration 030), or one its victim still overlaps, is left out instead of failing every cycle."""
    nodes = [mig_node("m1", gpus=1)]
    held_for_hp = {"hp": [Held("m1", 0, 0, 0, "3g.40gb", 0)]}
    snapshot = build_cluster(nodes, {"other": [Held("m1", 0, 0, 0, "3g.40gb", 4)]}, held_for_hp)
    work = [PendingPlacement("small", 1, None, 5, 1, mig_profile="1g.10gb"),
            PendingPlacement("hp", 1, None, 0, 2, mig_profile="3g.40gb")]
    placements, deferrals = plan_cycle(snapshot, work, bestfit, nodes)
    assert [(p.job_id, p.mig_start) for p in placements] == [("hp", 0)] and [d.job_id for d in deferrals] == ["small"]
    legacy = build_cluster(nodes, {}, {"hp": [("m1", 0)]})  # a whole GPU held on a MIG GPU: not counted
    assert plan_cycle(legacy, work[:1], bestfit, nodes)[0][0].job_id == "small"
    overlapped = build_cluster(nodes, {"victim": [Held("m1", 0, 0, 0, "7g.80gb", 0)]}, held_for_hp)
    assert "nominated-for/hp" not in overlapped.allocations  # counts once the victim let go of the slice


def reference_plan(snapshot, pending, policy, nodes):
    """Every waiting job searched for on its own (the cycle before it remembered shapes that found no room)."""
    from gpusched_core.placement.cycle import Deferral, nomination_id, order_pending, placement_of, request_for
    gpus = {(n.node_id, g.index): g for n in nodes for g in n.gpus}
    placements, deferrals = [], []
    for pending_job in order_pending(pending):
        held = engine.RequestId(nomination_id(pending_job.job_id))
        view = engine.release(snapshot, held) if held in snapshot.allocations else snapshot
        decision = engine.place(view, request_for(pending_job), policy)
        if not decision.placed:
            reasons = tuple(str(r) for r in decision.unplaced_by_class) or decision.reasons
            if decision.unplaced_by_class and decision.reasons and decision.reasons[0].startswith("gang"):
                reasons = (decision.reasons[0], *reasons)
            deferrals.append(Deferral(pending_job.job_id, reasons))
            continue
        snapshot = engine.apply(view, decision)
        placements.append(placement_of(pending_job, decision, gpus))
    return placements, deferrals


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2), st.sampled_from([None, "H100-80GB", "A100-80GB"]),
                          st.integers(1, 2)), min_size=1, max_size=40),
       st.integers(1, 4), st.booleans())
def test_waiting_jobs_of_a_shape_that_found_no_room_get_the_same_answer_without_a_search(jobs, node_count, ours):
    """The cycle skips the search for a job whose shape found no room on the same snapshot (issue 16): every
    placement and every deferral, with its reasons, is what searching for each job gives."""
    policy = engine.make_policy("ours" if ours else "bestfit")
    nodes = [a_node(f"n{i}", model="H100-80GB" if i % 2 else "A100-80GB") for i in range(node_count)]
    nominated = {"w0": [("n0", 0)]} if jobs[0][0] == 1 else {}
    snapshot = build_cluster(nodes, {"old": [("n0", 7)]}, nominated)
    pending = [PendingPlacement(f"w{i}", gpus, model, priority, i, nodes=members)
               for i, (gpus, priority, model, members) in enumerate(jobs)]
    expected = reference_plan(snapshot, pending, engine.make_policy("ours" if ours else "bestfit"), nodes)
    assert plan_cycle(snapshot, pending, policy, nodes) == expected


_FIELDS = st.fixed_dictionaries({
    "gpus": st.integers(1, 8), "gpu_model": st.sampled_from([None, "H100-80GB"]), "nodes": st.integers(1, 3),
    "share_milli": st.sampled_from([None, 250, 500, 1000]), "share_memory_mib": st.sampled_from([0, 4096]),
    "mig_profile": st.sampled_from([None, "1g.10gb"]), "cpu_milli": st.sampled_from([0, 4000]),
    "memory_mib": st.sampled_from([0, 8192]), "node_selector": st.sampled_from([(), (("rack", "r1"),)])})


@given(_FIELDS, _FIELDS)
def test_jobs_of_one_shape_make_the_same_request_but_for_its_id(a, b):
    """The cycle's memo of shapes that found no room is keyed by ``shape_of``: two single-node jobs with
    equal shapes ask for the same thing; a gang has no shape (its members are placed one by one)."""
    first, second = PendingPlacement("a", priority=0, seq=1, **a), PendingPlacement("b", priority=5, seq=2, **b)
    for job_ in (first, second):
        assert (shape_of(job_) is None) == isinstance(request_for(job_), engine.GangRequest)
    if shape_of(first) is not None and shape_of(first) == shape_of(second):
        assert replace(request_for(first), id=engine.RequestId("x")) == replace(request_for(second),
                                                                               id=engine.RequestId("x"))
