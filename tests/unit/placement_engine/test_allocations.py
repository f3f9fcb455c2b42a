"""``Allocations``: the immutable allocation map snapshots share. Whatever the updates, it reads as the dict
the same updates would make, and every earlier version stays as it was."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.placement.allocations import Allocations
from gpusched_core.placement.model import Binding

IDS = st.sampled_from([f"a{i}" for i in range(40)])


def bindings(n: int) -> tuple[Binding, ...]:
    return (Binding(node_id=f"n{n}", gpu_indices=(n % 8,), gpu_milli=1000),)


updates = st.lists(st.tuples(st.dictionaries(IDS, st.integers(0, 99).map(bindings), max_size=6),
                             st.lists(IDS, max_size=6)), max_size=60)


def expect(model: dict, added: dict, removed: list) -> dict:
    out = {k: v for k, v in model.items() if k not in set(removed)}
    out.update(added)
    return out


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(IDS, st.integers(0, 99).map(bindings), max_size=30), updates)
def test_it_reads_as_the_dict_the_same_updates_make_and_earlier_versions_never_change(start, steps):
    versions = [(Allocations(start), dict(start))]
    for added, removed in steps:
        current, model = versions[-1]
        versions.append((current.evolve(added, removed), expect(model, added, removed)))
    for allocations, model in versions:
        assert dict(allocations) == model and len(allocations) == len(model)
        assert list(allocations) == list(dict.fromkeys(allocations))  # each id once
        for key in [f"a{i}" for i in range(40)]:
            assert (key in allocations) == (key in model)
            assert allocations.get(key) == model.get(key)


def test_many_updates_fold_into_a_new_base_without_losing_any():
    allocations = Allocations()
    for i in range(1000):
        allocations = allocations.evolve({f"j{i}": bindings(i)}, [f"j{i - 500}"] if i >= 500 else [])
    assert len(allocations) == 500 and set(allocations) == {f"j{i}" for i in range(500, 1000)}
    assert allocations == {f"j{i}": bindings(i) for i in range(500, 1000)}
