from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.quota.core import Ledger, PendingJob, plan_reservations


def job(job_id: str, gpus: int, priority: int = 0, seq: int = 0) -> PendingJob:
    return PendingJob(job_id, gpus, priority, seq)


def test_jobs_reserve_in_order_until_the_cap():
    reservations, deferrals = plan_reservations(Ledger("t", 8, 0), [job("a", 4, seq=1), job("b", 4, seq=2),
                                                                    job("c", 1, seq=3)])
    assert [r.job_id for r in reservations] == ["a", "b"]
    assert [(d.job_id, d.reason) for d in deferrals] == [("c", "tenant t is at its quota of 8 GPUs")]


def test_higher_priority_goes_first():
    reservations, _ = plan_reservations(Ledger("t", 4, 0), [job("low", 4, 0, seq=1), job("high", 4, 10, seq=2)])
    assert [r.job_id for r in reservations] == ["high"]


def test_a_blocked_job_is_not_overtaken_by_smaller_later_jobs():
    reservations, deferrals = plan_reservations(Ledger("t", 8, 6), [job("big", 4, seq=1), job("small", 1, seq=2)])
    assert reservations == []
    assert "earlier jobs of the tenant go first" in deferrals[1].reason


def test_a_job_larger_than_the_cap_never_blocks_others():
    reservations, deferrals = plan_reservations(Ledger("t", 4, 0), [job("huge", 8, seq=1), job("ok", 2, seq=2)])
    assert [r.job_id for r in reservations] == ["ok"]
    assert deferrals[0].reason == "job needs 8 GPUs but tenant t has a cap of 4 GPUs"


@given(cap=st.integers(0, 32), reserved=st.integers(0, 32),
       gpus=st.lists(st.integers(1, 8), max_size=20), priorities=st.lists(st.integers(0, 3), min_size=20,
                                                                          max_size=20))
def test_reservations_never_exceed_the_cap(cap, reserved, gpus, priorities):
    reserved = min(reserved, cap)
    pending = [job(f"j{i}", g, priorities[i], seq=i) for i, g in enumerate(gpus)]
    reservations, deferrals = plan_reservations(Ledger("t", cap, reserved), pending)
    total = reserved + sum(g for g, p in zip(gpus, pending) if p.job_id in {r.job_id for r in reservations})
    assert total <= cap
    assert len(reservations) + len(deferrals) == len(pending)
    assert plan_reservations(Ledger("t", cap, reserved), list(reversed(pending))) == (reservations, deferrals)


def test_earlier_submissions_go_first_whatever_order_they_arrived_in():
    from datetime import timedelta

    from tests.builders import T0

    early = PendingJob("early", 8, 0, seq=2, submitted_at=T0)
    late = PendingJob("late", 8, 0, seq=1, submitted_at=T0 + timedelta(seconds=1))
    reservations, _ = plan_reservations(Ledger("t", 8, 0), [late, early])
    assert [r.job_id for r in reservations] == ["early"]
