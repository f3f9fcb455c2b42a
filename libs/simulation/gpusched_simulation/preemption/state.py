"""Mutable state of one replay: the virtual clock, the snapshot, the queue, runs and the tallies.

Work model: a pod has ``work_s`` seconds of work. A resumed run first spends ``restore_s`` restoring
its checkpoint, then progresses; it checkpoints every ``checkpoint_interval_s`` of progress (and, with
``checkpoint_on_notice``, once more when told it is preempted). A preempted pod keeps the progress of
its last checkpoint; the rest of the run (restore included) is GPU time lost to preemption.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from gpusched_core.placement import ClusterSnapshot, Decision, PlacementPolicy, RequestId, apply, release
from gpusched_core.preemption import RunningJob

from ..clock import EventQueue
from .workload import SimPod

FINISH, REQUEUE, UNPROTECT = 0, 1, 2


@dataclass(frozen=True)
class SimConfig:
    preemption: bool = False
    grace_s: float = 30.0
    checkpoint_interval_s: float = 600.0
    checkpoint_on_notice: bool = False
    restore_s: float = 60.0
    min_runtime_s: float = 60.0
    max_preemption_attempts: int = 4


@dataclass(slots=True)
class Run:
    pod: SimPod
    start_s: float  # when the pod starts computing (a preemptor's starts after the victims' grace)
    overhead_s: float  # restore time at the start of a resumed run
    end_s: float
    epoch: int

    def progress_s(self, at_s: float) -> float:
        return max(0.0, at_s - self.start_s - self.overhead_s)

    def saved_s(self, at_s: float, interval_s: float) -> float:
        if interval_s <= 0:
            return 0.0
        return math.floor(self.progress_s(at_s) / interval_s) * interval_s


@dataclass(slots=True)
class PodRecord:
    pod: SimPod
    remaining_s: float
    first_start_s: float | None = None
    preemptions: int = 0
    epoch: int = 0


@dataclass
class SimState:
    snapshot: ClusterSnapshot
    policy: PlacementPolicy
    config: SimConfig
    window: tuple[float, float]
    now_s: float = 0.0
    records: dict[str, PodRecord] = field(default_factory=dict)
    running: dict[str, Run] = field(default_factory=dict)
    pending: list[tuple[tuple[int, float, str], str]] = field(default_factory=list)
    events: EventQueue = field(default_factory=EventQueue)  # FINISH, REQUEUE and UNPROTECT of each pod
    version: int = 0  # bumped whenever preemption options may have changed
    busy_milli_s: float = 0.0
    lost_gpu_s: float = 0.0
    preemptions: int = 0

    # --- the queue ------------------------------------------------------------------------------

    def enqueue(self, pod_id: str) -> None:
        pod = self.records[pod_id].pod
        bisect.insort(self.pending, ((-pod.priority, pod.created_s, pod_id), pod_id))

    def dequeue(self, pod_id: str) -> None:
        pod = self.records[pod_id].pod
        key = (-pod.priority, pod.created_s, pod_id)
        del self.pending[bisect.bisect_left(self.pending, (key,))]

    # --- runs -----------------------------------------------------------------------------------

    def start(self, pod_id: str, decision: Decision, start_s: float, *, reserved: bool = False) -> None:
        """Run ``pod_id`` from ``start_s``; ``reserved``: its slot is already in the snapshot."""
        record = self.records[pod_id]
        if not reserved:
            self.snapshot = apply(self.snapshot, decision)
        self.dequeue(pod_id)
        overhead = self.config.restore_s if record.preemptions else 0.0
        record.epoch += 1
        run = Run(record.pod, start_s, overhead, start_s + overhead + record.remaining_s, record.epoch)
        self.running[pod_id] = run
        if record.first_start_s is None:
            record.first_start_s = start_s
        self.events.push(run.end_s, FINISH, pod_id, run.epoch)
        if record.pod.priority < 100:
            self.version += 1
            if self.config.preemption and self.config.min_runtime_s > 0:
                self.events.push(start_s + self.config.min_runtime_s, UNPROTECT, pod_id)

    def finish(self, pod_id: str, epoch: int) -> bool:
        run = self.running.get(pod_id)
        if run is None or run.epoch != epoch:
            return False
        del self.running[pod_id]
        self.snapshot = release(self.snapshot, RequestId(pod_id))
        self.records[pod_id].remaining_s = 0.0
        self._busy(run.pod, run.start_s, run.end_s)
        self.version += 1
        return True

    def stop_for_preemption(self, pod_id: str, stop_s: float) -> None:
        """The victim stops at ``stop_s`` (end of grace); its allocation is already released."""
        run = self.running.pop(pod_id)
        record = self.records[pod_id]
        if run.end_s <= stop_s:  # it finishes within its grace period: nothing is lost
            record.remaining_s = 0.0
            self._busy(run.pod, run.start_s, run.end_s)
            return
        progress = run.progress_s(stop_s)
        saved = progress if self.config.checkpoint_on_notice else run.saved_s(stop_s, self.config.checkpoint_interval_s)
        saved = min(saved, record.remaining_s)
        lost_s = (stop_s - run.start_s) - saved
        self.lost_gpu_s += lost_s * run.pod.gpu_milli / 1000.0
        record.remaining_s -= saved
        record.preemptions += 1
        self.preemptions += 1
        self._busy(run.pod, run.start_s, stop_s)
        self.events.push(stop_s, REQUEUE, pod_id)

    def _busy(self, pod: SimPod, start_s: float, end_s: float) -> None:
        low, high = self.window
        overlap = min(end_s, high) - max(start_s, low)
        if overlap > 0:
            self.busy_milli_s += overlap * pod.gpu_milli

    # --- what the preemption core sees ----------------------------------------------------------

    def running_jobs(self) -> list[RunningJob]:
        interval = self.config.checkpoint_interval_s
        jobs = []
        for pod_id, run in self.running.items():
            saved = run.saved_s(self.now_s, interval)
            checkpoint = run.start_s + run.overhead_s + saved if saved > 0 else None
            jobs.append(RunningJob(pod_id, "openb", run.pod.priority, run.start_s, (pod_id,),
                                   run.pod.priority_class, run.pod.gpu_milli, checkpoint))  # fmt: skip
        return jobs
