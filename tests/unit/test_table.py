"""The CLI's plain-text tables (`gpusched_common.table`)."""

from __future__ import annotations

import pytest

from gpusched_common.table import render


@pytest.mark.parametrize("value,shown", [
    (12.345, "12.35"), (0.5, "0.50"), (0.0, "0.00"), (0.0018, "0.0018"), (0.00537, "0.0054"), (-0.0018, "-0.0018"),
    (1e-9, "0.0000000010"), (1e-15, "1e-15"), (None, "-"), (7, "7"), ("x", "x"), (float("inf"), "inf"),
])
def test_a_cell_shows_two_decimals_and_a_small_ratio_two_significant_digits(value, shown):
    header, rule, row = render(["V"], [(value,)]).split("\n")
    assert row.strip() == shown
