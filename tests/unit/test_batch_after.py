"""A batch's deferred work runs once per key, in key order (so concurrent replicas take locks alike), and
work that defers more (releases asking for their cohorts' cycles) has it run in its turn."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from gpusched_common.batching import Batch


async def test_work_runs_once_per_key_in_key_order_and_work_it_defers_runs_too():
    batch, ran = Batch(), []

    def work(key: str, *more: str):
        async def run(conn: object) -> None:
            ran.append(key)
            for other in more:
                batch.after(other, work(other))
        return run

    batch.after("reserve:b", work("reserve:b"))
    batch.after("release", work("release", "reserve:a", "reserve:b", "apply"))
    batch.after("release", work("ignored"))  # a key's first work is the one that runs

    await batch.finish(None)  # type: ignore[arg-type]

    # "apply" sorts before "release" but was deferred by it: it runs next, then what is left, in order
    assert ran == ["release", "apply", "reserve:a", "reserve:b"]


@given(st.lists(st.text("abc", min_size=1, max_size=3), max_size=8))
def test_without_nested_work_the_order_is_the_sorted_keys(keys):
    batch, ran = Batch(), []
    for key in keys:
        batch.after(key, lambda conn, key=key: _record(ran, key))
    asyncio.run(batch.finish(None))  # type: ignore[arg-type]
    assert ran == sorted(set(keys))


async def _record(ran: list[str], key: str) -> None:
    ran.append(key)
