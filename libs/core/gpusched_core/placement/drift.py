"""Drift between what a node runs and what the store expects of it (pure; issue 15).

The store is the truth, the node's heartbeat its own account: a job the node runs that the store no longer
places there (its StopJob was lost: a cancel, a requeue) or a job the store expects running there that the
node does not run (it ended and its exit report was lost) is drift. Drift seen for longer than
``DRIFT_WINDOW_S`` (reports and heartbeats overtake each other briefly) is settled by a ``ReconcileJobs`` of
the node's current epoch, at most once per ``resend_s``: the agent stops the unexpected job and reports
the missing one's exit again (``gpusched_core.agent.reconcile``).

A job whose start on the node is not yet acknowledged is not missing: its StartJob is re-sent instead
(services/placement/starts.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["DRIFT_WINDOW_S", "NodeAccount", "Verdict", "judge_drift"]

DRIFT_WINDOW_S = 10.0


@dataclass(frozen=True)
class NodeAccount:
    node_id: str
    reported: frozenset[str]  # the jobs its latest heartbeat says it runs
    expected: frozenset[str]  # the jobs holding GPUs on it in the store
    started: frozenset[str]  # of those, the ones whose start on this node the store acknowledged
    drift_since: datetime | None
    reconciled_at: datetime | None


@dataclass(frozen=True)
class Verdict:
    node_id: str
    drifting: bool
    reconcile: bool  # send a ReconcileJobs now
    unexpected: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def judge_drift(account: NodeAccount, now: datetime, resend_s: float) -> Verdict:
    unexpected = tuple(sorted(account.reported - account.expected))
    missing = tuple(sorted((account.expected & account.started) - account.reported))
    if not unexpected and not missing:
        return Verdict(account.node_id, drifting=False, reconcile=False)
    since = account.drift_since or now
    due = now - since >= timedelta(seconds=DRIFT_WINDOW_S) and (
        account.reconciled_at is None or now - account.reconciled_at >= timedelta(seconds=resend_s))
    return Verdict(account.node_id, drifting=True, reconcile=due, unexpected=unexpected, missing=missing)
