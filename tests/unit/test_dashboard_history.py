"""Usage history of the dashboard (gpusched_core.dashboard.history): the window's defaults and refusals, the
nearest-rank percentiles, waits' histogram bins, usage averaged over a bucket's sampling instants, preemptions
per bucket; properties: histogram counts sum to the count, percentiles are values of the sample, in order."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched_core.dashboard import UsageSample, WaitRow, WindowError, percentile, plan_history, plan_window
from gpusched_core.dashboard.history import histogram
from tests.builders import T0

H = timedelta(hours=1)


WINDOWS = [
    pytest.param(None, None, None, (T0 - 24 * H, T0, 300, 288), id="defaults-the-last-day-in-5-minute-buckets"),
    pytest.param(T0 - H, None, None, (T0 - H, T0, 15, 240), id="an-hour-in-15s-buckets"),
    pytest.param(T0 - 30 * 24 * H, None, None, (T0 - 30 * 24 * H, T0, 10800, 240), id="a-month-in-3h-buckets"),
    pytest.param(T0 - 400 * 24 * H, None, None, (T0 - 400 * 24 * H, T0, 115200, 300), id="beyond-the-steps"),
    pytest.param(T0 - H, T0 - H / 2, 7, (T0 - H, T0 - H / 2, 7, 258), id="a-step-asked-for-is-kept"),
]


@pytest.mark.parametrize(("since", "until", "step_s", "expected"), WINDOWS)
def test_a_window_gets_its_defaults_and_at_most_about_300_buckets(since, until, step_s, expected):
    window = plan_window(T0, since, until, step_s)
    assert (window.since, window.until, window.step_s, window.buckets) == expected


REFUSED = [
    pytest.param(T0, T0, None, "later than", id="empty"),
    pytest.param(T0, T0 - H, None, "later than", id="reversed"),
    pytest.param(T0 - 24 * H, None, 1, "at most 2000", id="too-many-buckets"),
    pytest.param(T0.replace(tzinfo=None), None, None, "time zone", id="since-without-a-zone"),
]


@pytest.mark.parametrize(("since", "until", "step_s", "said"), REFUSED)
def test_a_window_that_cannot_be_answered_is_refused_saying_why(since, until, step_s, said):
    with pytest.raises(WindowError, match=said):
        plan_window(T0, since, until, step_s)


def test_2000_buckets_are_answered_and_2001_refused():
    assert plan_window(T0, T0 - timedelta(seconds=2000), None, 1).buckets == 2000
    with pytest.raises(WindowError):
        plan_window(T0, T0 - timedelta(seconds=2001), None, 1)


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 90, 4), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90, 9), ([5], 99, 5),
    (list(range(1, 101)), 99, 99), (list(range(1, 101)), 50, 50), ([], 50, None)])
def test_percentiles_follow_the_nearest_rank_rule(values, p, expected):
    assert percentile(values, p) == expected


def test_histogram_bins_are_not_cumulative_and_the_last_is_unbounded():
    bins = histogram([0, 1, 1.5, 10, 59, 61, 3600, 3601, 10**6])
    assert bins == [{"le_s": 1, "count": 2}, {"le_s": 10, "count": 2}, {"le_s": 60, "count": 1},
                    {"le_s": 300, "count": 1}, {"le_s": 1800, "count": 0}, {"le_s": 3600, "count": 1},
                    {"le_s": None, "count": 2}]


def test_usage_is_averaged_over_the_bucket_s_sampling_instants_and_a_bucket_without_any_has_no_point():
    window = plan_window(T0, T0 - 3 * H, T0, 3600)
    at = [T0 - 3 * H + timedelta(minutes=m) for m in (0, 30)]  # two cycles in the first hour, none in the second
    third = T0 - H + timedelta(minutes=5)
    usage = [UsageSample(at[0], "a", "H100-80GB", 4.0, 2.0, 50.0),  # a held 4 for half of the hour: averages 2
             UsageSample(at[1], "b", "H100-80GB", 2.0, 0.0, None), UsageSample(third, "a", "H100-80GB", 1.0, 1.0, 90.0)]
    doc = plan_history(window, None, usage, [*at, third, T0 + H], [], [])
    series = {(s["tenant"], s["gpu_model"]): s["points"] for s in doc["series"]}
    first, last = window.start_of(0), window.start_of(2)
    assert series[("a", "H100-80GB")] == [[first, 2.0, 1.0, 50.0], [last, 1.0, 1.0, 90.0]]
    assert series[("b", "H100-80GB")] == [[first, 1.0, 0.0, None], [last, 0.0, 0.0, None]]
    assert (doc["step_s"], doc["buckets"], doc["tenant"]) == (3600, 3, None)


def test_waits_and_preemptions_are_summarised_per_tenant():
    window = plan_window(T0, T0 - 2 * H, T0, 3600)
    waits = [WaitRow("a", w) for w in (0.5, 5, 5, 120, 4000)] + [WaitRow("b", -3)]  # a clock skew counts as 0
    preempted = [("a", T0 - 2 * H), ("a", T0 - 2 * H + timedelta(minutes=1)), ("b", T0 - H), ("b", T0)]  # T0: outside
    doc = plan_history(window, None, [], [], waits, preempted)
    a, b = doc["waits"]
    assert (a["tenant"], a["count"], a["p50_s"], a["p90_s"], a["p99_s"]) == ("a", 5, 5.0, 4000.0, 4000.0)
    assert [h["count"] for h in a["histogram"]] == [1, 2, 0, 1, 0, 0, 1]
    assert (b["count"], b["p50_s"]) == (1, 0.0)
    assert doc["preemptions"] == [{"tenant": "a", "points": [[window.start_of(0), 2]]},
                                  {"tenant": "b", "points": [[window.start_of(1), 1]]}]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=10**5, allow_nan=False), max_size=200))
def test_histogram_counts_sum_to_the_count_and_percentiles_are_ordered_values_of_the_sample(values):
    doc = plan_history(plan_window(T0), None, [], [], [WaitRow("a", v) for v in values], [])
    if not values:
        assert doc["waits"] == []
        return
    [w] = doc["waits"]
    assert sum(h["count"] for h in w["histogram"]) == w["count"] == len(values)
    rounded = {round(v, 3) for v in values}
    assert w["p50_s"] <= w["p90_s"] <= w["p99_s"] and {w["p50_s"], w["p90_s"], w["p99_s"]} <= rounded


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10**7), st.integers(1, 10**4) | st.none())
def test_an_accepted_window_never_has_more_than_2000_buckets(span_s, step_s):
    try:
        window = plan_window(T0, T0 - timedelta(seconds=span_s), None, step_s)
    except WindowError:
        assert step_s is not None
        return
    assert 1 <= window.buckets <= 2000 and (step_s is not None or window.buckets <= 300)
