"""Drift between a node's own account of its jobs and the store's (gpusched_core.placement.drift)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched_core.placement.drift import DRIFT_WINDOW_S, NodeAccount, judge_drift, suspects

NOW = datetime(2026, 12, 2, tzinfo=timezone.utc)
LONG_AGO = NOW - timedelta(seconds=DRIFT_WINDOW_S + 1)
RECENTLY = NOW - timedelta(seconds=1)


def account(reported=(), expected=(), started=None, since=None, reconciled=None, reported_at=None,
            changed=None) -> NodeAccount:  # fmt: skip
    return NodeAccount("n1", frozenset(reported), frozenset(expected),
                       frozenset(expected if started is None else started), since, reconciled, reported_at,
                       changed or {})


@pytest.mark.parametrize("given_account, drifting, reconcile, unexpected, missing", [
    pytest.param(account(["a"], ["a"]), False, False, (), (), id="the node runs what the store expects"),
    pytest.param(account([], ["a"], started=[]), False, False, (), (),
                 id="a job whose start is not acknowledged is not missing (its StartJob is re-sent)"),
    pytest.param(account(["a", "b"], ["a"]), True, False, ("b",), (), id="a job run unexpectedly: drift, first seen"),
    pytest.param(account(["a", "b"], ["a"], since=RECENTLY), True, False, ("b",), (),
                 id="drift younger than the window waits (reports overtake heartbeats)"),
    pytest.param(account(["a", "b"], ["a"], since=LONG_AGO), True, True, ("b",), (),
                 id="drift older than the window: reconcile (a StopJob was lost)"),
    pytest.param(account([], ["a"], since=LONG_AGO), True, True, (), ("a",),
                 id="a started job the node no longer runs: reconcile (its exit report was lost)"),
    pytest.param(account([], ["a"], since=LONG_AGO, reconciled=RECENTLY), True, False, (), ("a",),
                 id="reconciled recently: not again before the resend interval"),
    pytest.param(account([], ["a"], since=LONG_AGO, reconciled=NOW - timedelta(seconds=31)), True, True, (), ("a",),
                 id="reconciled long ago: again"),
    pytest.param(account([], ["a"], since=LONG_AGO, reported_at=LONG_AGO, changed={"a": RECENTLY}), False, False, (),
                 (), id="a start the store recorded after the node's account: not missing from it"),
    pytest.param(account(["a"], [], since=LONG_AGO, reported_at=LONG_AGO, changed={"a": RECENTLY}), False, False, (),
                 (), id="an end the store recorded after the node's account: not run unexpectedly"),
    pytest.param(account([], ["a"], since=LONG_AGO, reported_at=RECENTLY, changed={"a": LONG_AGO - timedelta(1)}),
                 True, True, (), ("a",), id="an account newer than the job's start that lacks it: missing"),
    pytest.param(account([], ["a"], since=LONG_AGO, reported_at=LONG_AGO, changed={"a": LONG_AGO}), False, False, (),
                 (), id="recorded in the same instant (one batch): the account cannot tell yet"),
    pytest.param(account(["stray"], [], since=LONG_AGO, reported_at=RECENTLY), True, True, ("stray",), (),
                 id="a job the store does not know: judged whatever the account's age"),
    pytest.param(account(["stray"], [], since=LONG_AGO, reported_at=LONG_AGO), True, False, ("stray",), (),
                 id="no account since the drift was first seen: not settled yet (the one seen may have raced)"),
    pytest.param(account(["stray"], [], since=None, reported_at=RECENTLY), True, False, ("stray",), (),
                 id="first seen now: never settled at once"),
])
def test_drift_table(given_account, drifting, reconcile, unexpected, missing):
    verdict = judge_drift(given_account, NOW, resend_s=30)
    assert (verdict.drifting, verdict.reconcile, verdict.unexpected, verdict.missing) == (
        drifting, reconcile, unexpected, missing)


ids = st.frozensets(st.sampled_from("abcdef"))


@given(ids, ids, ids, st.none() | st.integers(0, 60), st.none() | st.integers(0, 60))
def test_reconcile_only_on_lasting_drift_and_never_twice_within_the_interval(reported, expected, started, since, last):
    since_at = None if since is None else NOW - timedelta(seconds=since)
    last_at = None if last is None else NOW - timedelta(seconds=last)
    verdict = judge_drift(NodeAccount("n", reported, expected, started & expected, since_at, last_at), NOW, 30)
    assert verdict.drifting == bool(reported - expected or (started & expected) - reported)
    if verdict.reconcile:
        assert verdict.drifting and since is not None and since >= DRIFT_WINDOW_S and (last is None or last >= 30)


times = st.none() | st.integers(0, 60)


@given(ids, ids, ids, times, st.dictionaries(st.sampled_from("abcdef"), st.integers(0, 60)))
def test_an_account_judges_only_the_jobs_the_store_recorded_before_it(reported, expected, started, account_age,
                                                                      changes):  # fmt: skip
    plain = NodeAccount("n", reported, expected, started & expected, LONG_AGO, None)
    timed = replace(plain, reported_at=None if account_age is None else NOW - timedelta(seconds=account_age),
                    changed_at={j: NOW - timedelta(seconds=age) for j, age in changes.items()})
    before, after = judge_drift(plain, NOW, 30), judge_drift(timed, NOW, 30)
    named = set(after.unexpected) | set(after.missing)
    assert set(after.unexpected) <= set(before.unexpected) and set(after.missing) <= set(before.missing)
    assert named <= suspects(plain)
    if after.reconcile:  # settled only on an account recorded after the drift was first seen
        assert timed.reported_at is None or timed.reported_at > LONG_AGO
    for job in suspects(plain):  # named exactly when the account is newer than the job's change, or either unknown
        judged = account_age is None or job not in changes or changes[job] > account_age
        assert (job in named) == judged


@pytest.mark.parametrize("barrier, committed, expected", [
    pytest.param({0: 10, 1: 5}, {0: 10, 1: 5}, True, id="everything in the log at the barrier was read"),
    pytest.param({0: 10, 1: 5}, {0: 12, 1: 7}, True, id="read beyond it"),
    pytest.param({0: 10, 1: 5}, {0: 9, 1: 5}, False, id="a partition behind: a heartbeat may wait there"),
    pytest.param({0: 10, 1: 0}, {0: 10}, True, id="an empty partition needs no offset"),
    pytest.param({0: 3}, {}, False, id="nothing committed yet"),
])
def test_placement_is_listening_once_caught_up_with_the_backlog(barrier, committed, expected):
    from gpusched_core.placement.leases import caught_up
    assert caught_up(barrier, committed) is expected
