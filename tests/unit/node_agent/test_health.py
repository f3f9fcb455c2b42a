"""The GPU health core: XID, ECC, throttling and lost GPUs, with hysteresis for throttling."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.node_agent.health import (
    DEGRADED, HEALTHY, LOST, UNHEALTHY, GpuHealth, HealthPolicy, assess, parse_xids, plan_health,
)
from services.node_agent.inventory import HealthObservation

POLICY = HealthPolicy(degrade_after=3, recover_after=3)


def obs(index: int = 0, **kw) -> HealthObservation:
    return HealthObservation(index=index, uuid=f"GPU-{index}", **kw)


def run(observations, policy=POLICY):
    state, changes = {}, []
    for o in observations:
        state, new = plan_health(state, [o], policy)
        changes.extend(new)
    return state, changes


def test_a_critical_xid_makes_the_gpu_unhealthy_with_the_xid_in_the_reason():
    state, changes = run([obs(ecc_uncorrected=0), obs(xids=(79,))])
    assert state[0].status == UNHEALTHY and not state[0].healthy
    assert state[0].reasons == ("XID 79 (GPU fell off the bus)",)
    assert [(c.before, c.after.status) for c in changes] == [(HEALTHY, UNHEALTHY)]


def test_application_xids_are_ignored():
    state, changes = run([obs(xids=(13, 31, 43))])
    assert state[0].status == HEALTHY and changes == []


def test_new_uncorrected_ecc_errors_make_the_gpu_unhealthy_but_old_ones_do_not():
    state, _ = run([obs(ecc_uncorrected=4), obs(ecc_uncorrected=4)])
    assert state[0].status == HEALTHY
    state, _ = run([obs(ecc_uncorrected=4), obs(ecc_uncorrected=5)])
    assert state[0].status == UNHEALTHY and state[0].reasons == ("1 uncorrected ECC error(s)",)


def test_a_gpu_that_fell_off_the_bus_is_lost_and_stays_lost():
    state, _ = run([obs(reachable=False), obs(), obs()])
    assert state[0].status == LOST and not state[0].healthy


def test_throttling_degrades_only_after_it_persists_and_recovers_only_after_clean_samples():
    hot = obs(throttle_reasons=("hw_thermal_slowdown",), temperature_c=93.0)
    state, _ = run([hot, hot])
    assert state[0].status == HEALTHY
    state, _ = run([hot, hot, hot])
    assert state[0].status == DEGRADED and state[0].healthy
    assert state[0].reasons == ("thermal throttling at 93 C",)
    state, _ = run([hot, hot, hot, obs(), obs()])
    assert state[0].status == DEGRADED
    state, _ = run([hot, hot, hot, obs(), obs(), obs()])
    assert state[0].status == HEALTHY


@given(st.lists(st.booleans(), max_size=60))
def test_flickering_throttle_changes_status_at_most_once_per_three_samples(pattern):
    hot = obs(throttle_reasons=("sw_power_cap",))
    _, changes = run([hot if p else obs() for p in pattern])
    assert len(changes) <= max(1, len(pattern) // 3 + 1)


def test_parse_xids():
    assert parse_xids("13, 31,43") == frozenset({13, 31, 43})
    assert assess(GpuHealth(0, "u"), obs(xids=(48,)), POLICY).xid == 48
