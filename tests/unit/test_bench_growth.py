"""The growth benchmark's pure parts (issue 16, part 4): its cells, how growth is stated."""

from __future__ import annotations

import argparse

import pytest

from gpusched_cli.bench_growth import cell_row, parse_counts, with_growth


def measured(placed: int, cpu_ms: float | None, kib: float | None = 1.5) -> dict:
    return {"placed": placed, "waiting": 10, "placed_per_s": 5.0, "submit_to_placed_p50_ms": 900.0,
            "cpu_ms_per_job_total": cpu_ms, "cpu_ms_per_job": {"quota": cpu_ms}, "idle_cores_total": 0.4,
            "rss_kib_per_waiting_job": {} if kib is None else {"quota": kib}, "rss_mib": {"quota": 80.0},
            "submit_s": 2.0}


@pytest.mark.parametrize("text, counts", [("100,1000,5000", [100, 1000, 5000]), ("50_000", [50000]),
                                          ("7,", [7])])
def test_counts_are_read_from_a_comma_separated_list(text, counts):
    assert parse_counts(text) == counts


@pytest.mark.parametrize("text", ["", "a,b", "0", "100,-1", "1.5"])
def test_counts_that_are_not_positive_whole_numbers_are_refused_with_the_text(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected"):
        parse_counts(text)


def test_growth_is_each_cell_s_cpu_per_job_over_the_first_cell_s():
    rows = with_growth([cell_row(100, 1000, measured(900, 20.0)), cell_row(1000, 1000, measured(1000, 50.0)),
                        cell_row(5000, 1000, measured(0, None, kib=None))])
    assert [r["cpu_growth"] for r in rows] == [1.0, 2.5, None]
    assert rows[2]["quota_kib_per_waiting_job"] is None and rows[0]["quota_kib_per_waiting_job"] == 1.5
    assert (rows[1]["nodes"], rows[1]["jobs"], rows[1]["placed"]) == (1000, 1000, 1000)
