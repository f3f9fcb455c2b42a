from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.placement.core import Deferral, Gpu, Node, PendingJob, Placement, Snapshot, place_one, plan_cycle


def a_node(node_id: str, gpus: int = 8, model: str = "H100-80GB", busy: tuple[int, ...] = ()) -> Node:
    return Node(node_id, tuple(Gpu(i, f"{node_id}-{i}", model, True, "x" if i in busy else None)
                               for i in range(gpus)))


def pending(job_id: str, gpus: int, model: str | None = None, priority: int = 0, seq: int = 0) -> PendingJob:
    return PendingJob(job_id, gpus, model, priority, seq)


def test_a_job_goes_to_the_first_node_with_room():
    snap = Snapshot((a_node("n1", busy=(0, 1, 2, 3, 4, 5, 6)), a_node("n2")))
    decision = place_one(snap, pending("j", 2))
    assert isinstance(decision, Placement)
    assert (decision.node_id, decision.gpu_indices) == ("n2", (0, 1))


def test_the_model_constraint_is_honoured():
    snap = Snapshot((a_node("n1", model="A100-80GB"), a_node("n2", model="H100-80GB")))
    decision = place_one(snap, pending("j", 1, "H100-80GB"))
    assert isinstance(decision, Placement) and decision.node_id == "n2"


def test_a_job_that_fits_nowhere_is_deferred_with_reasons_per_class_of_node():
    snap = Snapshot((a_node("n1", model="A100-80GB"), a_node("n2", busy=tuple(range(7))), a_node("n3", gpus=4)))
    decision = place_one(snap, pending("j", 8, "H100-80GB"))
    assert isinstance(decision, Deferral)
    assert decision.reasons == ("1 node(s): fewer than 8 GPUs of H100-80GB in total",
                                "1 node(s): fewer than 8 free GPUs of H100-80GB",
                                "1 node(s): no H100-80GB GPUs")


def test_unhealthy_gpus_are_never_chosen():
    node = Node("n1", (Gpu(0, "u0", "H100-80GB", healthy=False), Gpu(1, "u1", "H100-80GB")))
    decision = place_one(Snapshot((node,)), pending("j", 1))
    assert isinstance(decision, Placement) and decision.gpu_indices == (1,)


@given(st.lists(st.tuples(st.integers(1, 8), st.integers(0, 2)), max_size=30), st.integers(1, 4))
def test_a_cycle_never_allocates_a_gpu_twice_and_is_deterministic(jobs, nodes):
    snap = Snapshot(tuple(a_node(f"n{i}") for i in range(nodes)))
    work = [pending(f"j{i}", g, None, p, i) for i, (g, p) in enumerate(jobs)]
    placements, deferrals = plan_cycle(snap, work)
    used = [(p.node_id, i) for p in placements for i in p.gpu_indices]
    assert len(used) == len(set(used))
    assert len(placements) + len(deferrals) == len(work)
    assert plan_cycle(snap, list(reversed(work))) == (placements, deferrals)
