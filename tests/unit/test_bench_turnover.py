"""The turnover benchmark's arithmetic: idle gaps per GPU from agents' reports."""

from __future__ import annotations

from gpusched_cli.bench_turnover import gaps_ms, percentile


def test_gaps_are_per_gpu_from_one_exit_to_the_next_start():
    runs = [("n1", 0, 10.0, 11.0), ("n1", 0, 11.05, 12.0), ("n1", 1, 10.0, 10.5), ("n1", 1, 10.75, 11.0),
            ("n2", 0, 11.2, 11.4)]  # n2's single run has no gap
    assert sorted(round(g, 3) for g in gaps_ms(runs)) == [50.0, 250.0]


def test_a_start_reported_a_tick_before_the_previous_exit_counts_as_no_gap_and_order_does_not_matter():
    runs = [("n", 0, 2.0, 3.0), ("n", 0, 0.0, 2.001)]
    assert gaps_ms(runs) == [0.0]


def test_percentiles_of_gaps():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99)) == (51.0, 99.0)
    assert percentile([], 0.5) != percentile([], 0.5)  # nan: no gaps measured
