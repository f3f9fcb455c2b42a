"""Pacing a cohort's reservation cycles (``gpusched_common.pacing``): when a batch runs the cycle itself, when it
leaves it due, and the loop that runs what is due."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_common.pacing import PACED_FROM_S, RETRY_S, CyclePacer, next_cycle_at, run_due


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("ended, took, share, expected", [
    (10.0, 0.6, 0.5, 10.6),   # half the time in cycles: as long a pause as the cycle took
    (10.0, 0.6, 0.25, 11.8),  # a quarter: three times as long
    (10.0, 0.6, 1.0, 10.0),   # every batch runs its cycle
    (10.0, 0.0, 0.5, 10.0),   # a cycle that took nothing delays nothing
])
def test_the_next_cycle_waits_in_proportion_to_the_last_one(ended, took, share, expected):
    assert next_cycle_at(ended, took, share) == pytest.approx(expected)


@given(took=st.floats(0, 10), share=st.floats(0.05, 1.0), paced_from=st.sampled_from([0.0, 0.05, 1.0]))
def test_cycles_back_to_back_take_at_most_their_share_of_the_time(took, share, paced_from):
    """...once they take long enough to be paced at all; a shorter one holds nothing back."""
    start, ended = 0.0, took
    following = next_cycle_at(ended, took, share, paced_from)
    if took >= paced_from:
        assert took <= share * (following - start) + 1e-9
    else:
        assert following == ended


def test_a_cycle_of_milliseconds_holds_no_batch_back():
    """A short queue (a GPU that frees, the next job reserved): every batch runs its own cycle at once, rather
    than leave it to the due loop's transaction."""
    clock = Clock()
    pacer = CyclePacer(0.5, clock)
    pacer.ran("cluster", 100.0, 100.03)  # shorter than PACED_FROM_S
    clock.now = 100.03
    assert pacer.may_run("cluster")
    pacer.ran("cluster", 100.0, 100.0 + 2 * PACED_FROM_S)  # longer: paced
    clock.now = 100.0 + 2 * PACED_FROM_S + 0.01
    assert not pacer.may_run("cluster")
    assert CyclePacer(0.5, clock, paced_from_s=0.0).may_run("never-ran")


def test_a_cohort_runs_at_once_until_its_last_cycle_says_to_wait_and_a_deferred_cycle_is_due_then():
    clock = Clock()
    pacer = CyclePacer(0.5, clock)
    assert pacer.may_run("acme")  # never ran
    pacer.ran("acme", 100.0, 100.4)  # 0.4 s over a long queue
    clock.now = 100.5
    assert not pacer.may_run("acme") and pacer.may_run("zeta")  # cohorts are paced apart
    pacer.defer("acme")
    assert pacer.due() == [] and pacer.wait_s() == pytest.approx(0.3)
    pacer.defer("acme")  # a second batch in the meantime: still one cycle, at the same time
    clock.now = 100.81
    assert pacer.may_run("acme") and pacer.due() == ["acme"] and pacer.due() == []
    assert pacer.wait_s() is None


def test_a_cycle_that_failed_is_due_again_shortly():
    clock = Clock()
    pacer = CyclePacer(0.5, clock)
    pacer.retry("acme")
    assert pacer.wait_s() == pytest.approx(RETRY_S)
    clock.now += RETRY_S
    assert pacer.due() == ["acme"]


async def test_the_loop_runs_each_due_cycle_times_it_and_retries_one_that_failed():
    pacer = CyclePacer(0.5)
    ran: list[str] = []
    failures: list[str] = []
    done = asyncio.Event()

    async def cycle(cohort: str) -> None:
        ran.append(cohort)
        if cohort == "bad" and ran.count("bad") == 1:
            raise ConnectionError("the database is away")
        if ran.count("bad") == 2 and "good" in ran:
            done.set()

    pacer.defer("good")  # never ran: due now
    pacer.defer("bad")
    task = asyncio.create_task(run_due(pacer, cycle, lambda cohort, exc: failures.append(cohort)))
    try:
        await asyncio.wait_for(done.wait(), RETRY_S + 5)
    finally:
        task.cancel()
    assert ran == ["bad", "good", "bad"] and failures == ["bad"]
    assert "good" in pacer._last and "bad" in pacer._last


async def test_a_batch_runs_its_cycle_timed_when_pacing_lets_it_and_else_leaves_it_due_after_its_commit():
    from gpusched_common.batching import Batch

    clock = Clock()
    pacer = CyclePacer(0.5, clock)
    ran: list[str] = []

    async def cycle() -> None:
        ran.append("cycle")
        clock.now += 0.4  # over a long queue

    batch = Batch()
    await pacer.run_or_defer("cluster", batch, cycle)
    assert ran == ["cycle"] and batch.committed == {} and not pacer.may_run("cluster")  # timed: 0.4 s
    later = Batch()
    await pacer.run_or_defer("cluster", later, cycle)
    assert ran == ["cycle"] and pacer.wait_s() is None  # not run; due only once the batch committed
    for done in later.committed.values():
        done()
    assert pacer.wait_s() == pytest.approx(0.4)
