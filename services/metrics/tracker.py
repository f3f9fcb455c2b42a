"""The latest NVML sample of every GPU, kept in memory as telemetry arrives (the metrics service's hot
path: one call per telemetry message, no I/O)."""

from __future__ import annotations

from datetime import datetime

from pydantic import ValidationError

from gpusched_common import events as ev
from gpusched_common.messaging import PoisonMessage

from gpusched_core.metrics.views import BUSY_THRESHOLD_PCT, GpuReading

GpuKey = tuple[str, int]


class TelemetryTracker:
    def __init__(self, busy_pct: float = BUSY_THRESHOLD_PCT) -> None:
        self.busy_pct = busy_pct
        self.latest: dict[GpuKey, tuple[ev.GpuSample, datetime]] = {}
        self.last_busy: dict[GpuKey, datetime] = {}
        self.messages = 0
        self.samples = 0

    def ingest(self, value: bytes) -> int:
        """Take one telemetry message; returns the GPU samples it carried (0 for other report types)."""
        payload = parse_telemetry(value)
        if payload is None:
            return 0
        self.record(payload)
        return len(payload.samples)

    def record(self, telemetry: ev.GpuTelemetry) -> None:
        at = telemetry.sampled_at
        for sample in telemetry.samples:
            key = (telemetry.node_id, sample.index)
            previous = self.latest.get(key)
            if previous is not None and previous[1] > at:
                continue  # an older sample delivered late
            self.latest[key] = (sample, at)
            if sample.utilization_pct > self.busy_pct or key not in self.last_busy:
                self.last_busy[key] = at  # busy now, or first seen (idle time counts from here)
        self.messages += 1
        self.samples += len(telemetry.samples)

    def activity(self) -> dict[GpuKey, GpuReading]:
        return {key: GpuReading(key[0], key[1], sample.utilization_pct, at, sample.memory_used_mib,
                                self.last_busy.get(key), sample.healthy)
                for key, (sample, at) in list(self.latest.items())}

    def job_memory_mib(self) -> dict[tuple[str, str], int]:
        """(job, node) -> GPU memory its processes use, from the per-process samples."""
        used: dict[tuple[str, str], int] = {}
        for (node_id, _), (sample, _) in list(self.latest.items()):
            for process in sample.processes:
                if process.job_id:
                    key = (process.job_id, node_id)
                    used[key] = used.get(key, 0) + process.memory_used_mib
        return used


def parse_telemetry(value: bytes) -> ev.GpuTelemetry | None:
    """The telemetry a message carries (None: another report type); PoisonMessage where it is unreadable."""
    try:
        envelope = ev.Envelope.model_validate_json(value)
        if envelope.type != ev.GpuTelemetry.TYPE:
            return None
        payload = ev.parse_payload(envelope)
    except (ValueError, ValidationError) as exc:
        raise PoisonMessage(f"unreadable telemetry: {exc}") from exc
    assert isinstance(payload, ev.GpuTelemetry)
    return payload
