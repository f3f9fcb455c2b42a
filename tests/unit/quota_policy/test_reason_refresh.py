"""Which waiting reasons quota writes to a job's stream (issue 16): a new kind of wait at once, moved figures
at most every ``REASON_REFRESH_S``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_core.quota.reasons import REASON_REFRESH_S, reason_kind, worth_recording

AT_QUOTA = "tenant a at quota ({}/8 H100-80GB); cohort can lend {}, job needs 1"
LIMIT = "tenant a at its limit (12/8 H100-80GB + borrowing 4); job needs 1"


@pytest.mark.parametrize(("last", "last_at", "reason", "now", "recorded"), [
    (None, None, AT_QUOTA.format(8, 2), 100.0, True),  # first reason
    (AT_QUOTA.format(8, 2), 99.0, AT_QUOTA.format(8, 2), 100.0, False),  # the same: never twice
    (AT_QUOTA.format(7, 2), 99.0, AT_QUOTA.format(8, 1), 100.0, False),  # figures moved, just recorded
    (AT_QUOTA.format(7, 2), 100.0 - REASON_REFRESH_S, AT_QUOTA.format(8, 1), 100.0, True),  # and long ago
    (AT_QUOTA.format(8, 2), 99.0, LIMIT, 100.0, True),  # another kind of wait: at once
    (AT_QUOTA.format(8, 2), 99.0, "fits quota; waiting for capacity", 100.0, True),
    (AT_QUOTA.format(8, 2), None, AT_QUOTA.format(8, 1), 100.0, True),  # recorded before the time was kept
])
def test_which_reasons_are_recorded(last, last_at, reason, now, recorded):
    assert worth_recording(last, last_at, reason, now) is recorded


def test_reason_kind_blanks_figures_only():
    assert reason_kind(AT_QUOTA.format(3, 1.5)) == reason_kind(AT_QUOTA.format(7, 0))
    assert reason_kind("tenant a0 at quota") != reason_kind("tenant b at quota")


@given(st.integers(0, 64), st.integers(0, 64), st.floats(0, 1e6), st.floats(0, 1e6))
def test_moved_figures_are_recorded_at_most_every_refresh(before, after, last_at, now):
    """However the figures move, a reason of the same kind is written again only after the refresh time."""
    recorded = worth_recording(AT_QUOTA.format(before, 1), last_at, AT_QUOTA.format(after, 1), now)
    assert recorded == (before != after and now - last_at >= REASON_REFRESH_S)
