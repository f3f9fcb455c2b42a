"""The agent's lease: renewals, expiry and fencing."""

from __future__ import annotations

from gpusched_core.agent.lease import acquire, check, renewed


def test_a_lease_renewed_in_time_never_fences():
    lease = acquire(epoch=3, ttl_s=30.0, now=0.0)
    for t in range(10, 200, 10):
        lease = renewed(lease, float(t))
        lease, lost = check(lease, t + 5.0)
        assert not lost and lease.valid


def test_a_lease_without_accepted_heartbeats_for_ttl_fences_once():
    lease = renewed(acquire(epoch=1, ttl_s=30.0, now=0.0), 10.0)
    lease, lost = check(lease, 40.0)
    assert not lost
    lease, lost = check(lease, 40.5)
    assert lost and lease.fenced and lease.epoch == 1
    lease, again = check(lease, 90.0)
    assert not again


def test_a_fenced_lease_is_not_renewed_by_a_late_heartbeat():
    lease, _ = check(acquire(epoch=1, ttl_s=5.0, now=0.0), 6.0)
    assert renewed(lease, 7.0).fenced


def test_a_zero_ttl_means_no_lease():
    _, lost = check(acquire(epoch=1, ttl_s=0.0, now=0.0), 1e9)
    assert not lost
