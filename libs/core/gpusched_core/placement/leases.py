"""Node leases (pure): which nodes have gone silent for longer than their lease plus the fencing grace."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpusched_common.events import ExitReason


@dataclass(frozen=True)
class NodeLease:
    node_id: str
    epoch: int
    last_seen_at: datetime
    ttl_s: float  # 0: the agent holds no lease (never expires)
    fence_grace_s: float
    lost: bool


def select_expired(leases: list[NodeLease], now: datetime) -> list[NodeLease]:
    """Nodes to declare lost: a lease is held, not already lost, and silent for longer than ttl + grace.

    The grace covers the agent's own fencing: it stops its jobs once `ttl_s` passes without an accepted
    heartbeat, so by ttl + grace nothing of the lost epoch still runs and requeuing cannot run a job twice.
    """
    expired = [
        lease for lease in leases
        if lease.ttl_s > 0 and not lease.lost
        and now - lease.last_seen_at > timedelta(seconds=lease.ttl_s + lease.fence_grace_s)
    ]
    return sorted(expired, key=lambda lease: lease.node_id)


def is_stale(report_epoch: int | None, lost_epoch: int | None) -> bool:
    """A report from an epoch already declared lost must not change anything."""
    return report_epoch is not None and lost_epoch is not None and report_epoch <= lost_epoch


def other_run(node_ids: tuple[str, ...], runs: int, node_id: str, attempt: int | None) -> str | None:
    """Why a node's report of a job is not about the job's latest run (None: it is): the report names
    another attempt (a run before a requeue or preemption), or the job is placed and not on that node.
    A report naming the latest attempt after that run ended (its final checkpoint, reported after the
    preemption was recorded) is still that run's; one naming no attempt must come from a node it is on."""
    if attempt is not None and attempt != runs:
        return f"attempt {attempt} is not the job's current run ({runs})"
    if node_id not in node_ids and (node_ids or attempt is None):
        return f"the job does not run on {node_id}"
    return None


# the exits an agent reports that requeue the job rather than end it (no fault of the job's), and what the
# requeue says
REQUEUE_REASON_CODES = {
    ExitReason.GPU_UNHEALTHY: "its GPU became unhealthy",
    ExitReason.MISSING_AFTER_RESTART: "its node agent restarted and no longer had it",
    # the agent fenced itself (its heartbeats went unacknowledged for the lease, a broker blip, say) before
    # placement declared the node lost: no fault of the job's (issue 15)
    ExitReason.LEASE_LOST: "its node lost its lease and stopped it",
}


def caught_up(barrier: dict[int, int], committed: dict[int, int]) -> bool:
    """Whether a consumer group has read everything that was in the log when ``barrier`` (the end offsets
    per partition) was taken: its committed offsets reach the barrier on every partition that had data.
    The owner of leases declares no node lost before: a heartbeat may be waiting in that backlog (consumer
    lag is the owner not listening, not the node being silent)."""
    return all(committed.get(partition, 0) >= end for partition, end in barrier.items() if end > 0)
