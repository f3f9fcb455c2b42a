from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_core.quota import UsageHistory, accrued, advance, average_rate, decayed

H = 3600.0


@pytest.mark.parametrize("elapsed_s, expected", [(0, 100.0), (H, 50.0), (2 * H, 25.0), (-5, 100.0)],
                         ids=["now", "one-half-life", "two-half-lives", "clock-went-back"])
def test_usage_halves_every_half_life(elapsed_s, expected):
    assert decayed(100.0, elapsed_s, H) == pytest.approx(expected)


def test_no_memory_with_a_zero_half_life():
    assert decayed(100.0, 1, 0) == 0.0 and accrued(8, 100, 0) == 0.0


def test_a_steady_rate_converges_to_that_rate():
    history = advance(UsageHistory(0.0), 100 * H, {"A100": 8.0}, H)
    assert average_rate(history, "A100", H) == pytest.approx(8.0, rel=1e-6)


def test_advancing_in_steps_equals_advancing_at_once():
    once = advance(UsageHistory(0.0, {"A100": 1e5}), 5000.0, {"A100": 4.0}, H)
    step = UsageHistory(0.0, {"A100": 1e5})
    for t in (1000.0, 2500.0, 5000.0):
        step = advance(step, t, {"A100": 4.0}, H)
    assert step.geq_s["A100"] == pytest.approx(once.geq_s["A100"])


def test_an_out_of_order_time_changes_nothing():
    history = UsageHistory(50.0, {"A100": 10.0})
    assert advance(history, 40.0, {"A100": 8.0}, H) is history


@given(value=st.floats(0, 1e9), t1=st.floats(0, 1e6), t2=st.floats(0, 1e6), half_life=st.floats(1, 1e6))
def test_decay_is_monotone_in_elapsed_time(value, t1, t2, half_life):
    early, late = sorted((t1, t2))
    assert decayed(value, late, half_life) <= decayed(value, early, half_life) + 1e-9


@given(rate=st.floats(0, 1e4), elapsed=st.floats(0, 1e6), h1=st.floats(1, 1e6), h2=st.floats(1, 1e6))
def test_a_longer_half_life_remembers_at_least_as_much(rate, elapsed, h1, h2):
    short, long_ = sorted((h1, h2))
    assert accrued(rate, elapsed, long_) >= accrued(rate, elapsed, short) - 1e-6 * max(1.0, rate * elapsed)
    assert accrued(rate, elapsed, long_) <= rate * elapsed * (1 + 1e-9) + 1e-9
    assert not math.isnan(accrued(rate, elapsed, short))
