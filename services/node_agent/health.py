"""GPU health from NVML signals (pure): which GPUs are healthy, degraded, unhealthy or lost, and when that
changes.

Rules, per GPU and observation:
- not reachable (fell off the bus; XID 79)                   -> lost       (sticky)
- an XID not in the ignored set (application errors such as 13, 31, 43, 45, 68, 109 are ignored, as the
  NVIDIA device plugin does)                                  -> unhealthy  (sticky)
- the uncorrected ECC count rose above the first value seen   -> unhealthy  (sticky)
- thermal or power throttling for `degrade_after` observations in a row -> degraded; it recovers after
  `recover_after` clean observations in a row (hysteresis, so a flickering sensor does not flap).
Sticky states end only when the agent restarts after the GPU was repaired (NVML resets the counters).
A degraded GPU stays schedulable (`healthy=True`); unhealthy and lost GPUs are cordoned (`healthy=False`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from services.node_agent.inventory import POWER_REASONS, THERMAL_REASONS, HealthObservation

HEALTHY, DEGRADED, UNHEALTHY, LOST = "healthy", "degraded", "unhealthy", "lost"
_STICKY = (UNHEALTHY, LOST)
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class HealthPolicy:
    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    degrade_after: int = 3
    recover_after: int = 3


@dataclass(frozen=True)
class GpuHealth:
    index: int
    uuid: str
    status: str = HEALTHY
    reasons: tuple[str, ...] = ()
    xid: int | None = None
    ecc_baseline: int | None = None
    throttled_run: int = 0
    clean_run: int = 0

    @property
    def healthy(self) -> bool:
        return self.status not in _STICKY


@dataclass(frozen=True)
class HealthChange:
    before: str
    after: GpuHealth


def parse_xids(text: str) -> frozenset[int]:
    return frozenset(int(p) for p in text.replace(" ", "").split(",") if p)


def assess(prev: GpuHealth, obs: HealthObservation, policy: HealthPolicy) -> GpuHealth:
    """The GPU's health after one observation."""
    baseline = prev.ecc_baseline if prev.ecc_baseline is not None else obs.ecc_uncorrected
    state = replace(prev, ecc_baseline=baseline)
    if state.status in _STICKY:
        return state
    if not obs.reachable:
        return replace(state, status=LOST, reasons=("GPU fell off the bus (NVML: GPU is lost)",), xid=79)
    fatal = [x for x in obs.xids if x not in policy.ignored_xids]
    if fatal:
        return replace(state, status=UNHEALTHY, xid=fatal[0],
                       reasons=tuple(f"XID {x}{_xid_hint(x)}" for x in dict.fromkeys(fatal)))
    if obs.ecc_uncorrected is not None and baseline is not None and obs.ecc_uncorrected > baseline:
        return replace(state, status=UNHEALTHY,
                       reasons=(f"{obs.ecc_uncorrected - baseline} uncorrected ECC error(s)",))
    return _throttling(state, obs, policy)


def _throttling(state: GpuHealth, obs: HealthObservation, policy: HealthPolicy) -> GpuHealth:
    reasons = set(obs.throttle_reasons)
    throttled = []
    if reasons & THERMAL_REASONS:
        temp = f" at {obs.temperature_c:.0f} C" if obs.temperature_c is not None else ""
        throttled.append(f"thermal throttling{temp}")
    if reasons & POWER_REASONS:
        throttled.append("power throttling")
    if throttled:
        run = state.throttled_run + 1
        if run >= policy.degrade_after:
            return replace(state, status=DEGRADED, reasons=tuple(throttled), throttled_run=run, clean_run=0)
        return replace(state, throttled_run=run, clean_run=0)
    clean = state.clean_run + 1
    if state.status == DEGRADED and clean < policy.recover_after:
        return replace(state, throttled_run=0, clean_run=clean)
    return replace(state, status=HEALTHY, reasons=(), throttled_run=0, clean_run=clean)


_XID_HINTS = {48: "double-bit ECC error", 63: "ECC page retirement / row remapping", 64: "row remapping failure",
              74: "NVLink error", 79: "GPU fell off the bus", 92: "high single-bit ECC rate",
              94: "contained ECC error", 95: "uncontained ECC error", 119: "GSP RPC timeout", 120: "GSP error"}


def _xid_hint(xid: int) -> str:
    hint = _XID_HINTS.get(xid)
    return f" ({hint})" if hint else ""


def plan_health(prev: Mapping[int, GpuHealth], observations: Iterable[HealthObservation],
                policy: HealthPolicy) -> tuple[dict[int, GpuHealth], list[HealthChange]]:
    """New health of every observed GPU and the status changes to report, in GPU order."""
    state = dict(prev)
    changes = []
    for obs in sorted(observations, key=lambda o: o.index):
        before = state.get(obs.index, GpuHealth(obs.index, obs.uuid))
        after = assess(before, obs, policy)
        state[obs.index] = after
        if after.status != before.status:
            changes.append(HealthChange(before.status, after))
    return state, changes
