"""The agent's side of the node lease (pure): renew on every heartbeat the broker accepted, fence when
none was accepted for `ttl_s`, take a new epoch when contact returns.

Contract with the owner of allocations (placement): it may declare the node lost only after
`ttl_s + fence_grace_s` without a heartbeat of the current epoch, measured from when it received the
last one. The agent stops its jobs `ttl_s` after its last accepted heartbeat was sent and gives them
`fence_grace_s` to exit before SIGKILL, so every job of a lost node has stopped before it can be
requeued: a job never runs twice. Reports carry the epoch, so stale ones can be told apart.
Times are monotonic seconds passed in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Lease:
    epoch: int
    ttl_s: float
    renewed_at: float  # when the last accepted heartbeat was sent
    fenced: bool = False

    def expired(self, now: float) -> bool:
        return self.ttl_s > 0 and now - self.renewed_at > self.ttl_s

    @property
    def valid(self) -> bool:
        return not self.fenced


def acquire(epoch: int, ttl_s: float, now: float) -> Lease:
    return Lease(epoch=epoch, ttl_s=ttl_s, renewed_at=now)


def renewed(lease: Lease, sent_at: float) -> Lease:
    """A heartbeat sent at `sent_at` was accepted. A fenced lease is not renewed: it must be re-acquired."""
    if lease.fenced:
        return lease
    return replace(lease, renewed_at=max(lease.renewed_at, sent_at))


def check(lease: Lease, now: float) -> tuple[Lease, bool]:
    """(lease, whether it has just been lost and the agent must fence now)."""
    if lease.fenced or not lease.expired(now):
        return lease, False
    return replace(lease, fenced=True), True
