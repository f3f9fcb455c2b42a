"""Drift between what a node runs and what the store expects of it (pure; issue 15).

The store is the truth, the node's heartbeat its own account: a job the node runs that the store no longer
places there (its StopJob was lost: a cancel, a requeue) or a job the store expects running there that the
node does not run (it ended and its exit report was lost) is drift. Drift seen for longer than
``DRIFT_WINDOW_S`` (reports and heartbeats overtake each other briefly) is settled by a ``ReconcileJobs`` of
the node's current epoch, at most once per ``resend_s``: the agent stops the unexpected job and reports
the missing one's exit again (``gpusched_core.agent.reconcile``).

A job whose start on the node is not yet acknowledged is not missing: its StartJob is re-sent instead
(services/placement/starts.py). And a job is judged against the node's account only when the store's record
of it is older than the account (``NodeAccount.reported_at``, ``changed_at``; issue 16): a heartbeat taken
before a job started cannot list it, nor one taken before a job ended leave it out, however long the next
heartbeat takes (every 10 s, the window's length: at 1,000 simulated nodes placement reconciled nodes that
had drifted from nothing). A drift is settled only once an account recorded after it was first seen shows
it still: a heartbeat built just before a job started can reach placement after the job's start report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

__all__ = ["DRIFT_WINDOW_S", "NodeAccount", "Verdict", "judge_drift", "suspects"]

DRIFT_WINDOW_S = 10.0


@dataclass(frozen=True)
class NodeAccount:
    node_id: str
    reported: frozenset[str]  # the jobs its latest heartbeat says it runs
    expected: frozenset[str]  # the jobs holding GPUs on it in the store
    started: frozenset[str]  # of those, the ones whose start on this node the store acknowledged
    drift_since: datetime | None
    reconciled_at: datetime | None
    reported_at: datetime | None = None  # when the store recorded that heartbeat (None: every job judged)
    # when the store last changed jobs (at least those ``suspects`` names: its start or end recorded, ...); a
    # job absent is unknown to the store and judged
    changed_at: Mapping[str, datetime] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    node_id: str
    drifting: bool
    reconcile: bool  # send a ReconcileJobs now
    unexpected: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()


def suspects(account: NodeAccount) -> frozenset[str]:
    """The jobs a verdict on ``account`` may name: run and not expected, or expected, started and not run."""
    return (account.reported - account.expected) | ((account.expected & account.started) - account.reported)


def _judged(account: NodeAccount, job_id: str) -> bool:
    """Whether the node's account is newer than the store's record of the job (else it cannot tell yet)."""
    changed = account.changed_at.get(job_id)
    return account.reported_at is None or changed is None or changed < account.reported_at


def judge_drift(account: NodeAccount, now: datetime, resend_s: float) -> Verdict:
    unexpected = tuple(sorted(j for j in account.reported - account.expected if _judged(account, j)))
    missing = tuple(sorted(j for j in (account.expected & account.started) - account.reported if _judged(account, j)))
    if not unexpected and not missing:
        return Verdict(account.node_id, drifting=False, reconcile=False)
    since = account.drift_since or now
    # seen again in an account recorded after the drift was first seen: one heartbeat that raced a start (built
    # before the job ran, sent after its start report) is followed by one that lists it
    renewed = account.reported_at is None or (account.drift_since is not None and account.reported_at > since)
    due = now - since >= timedelta(seconds=DRIFT_WINDOW_S) and renewed and (
        account.reconciled_at is None or now - account.reconciled_at >= timedelta(seconds=resend_s))
    return Verdict(account.node_id, drifting=True, reconcile=due, unexpected=unexpected, missing=missing)
