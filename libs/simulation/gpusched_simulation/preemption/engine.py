"""The virtual-clock replay of timed pods, with or without preemption.

At each event time: finish the runs that end, requeue preempted pods whose grace ended, enqueue the
arrivals, then schedule. Scheduling walks the queue (priority, then arrival, then pod id) and places
each pod with the placement engine (backfilling: a pod that does not fit does not block smaller ones
behind it). With preemption on, each blocked pod of higher than the lowest running priority then
asks the preemption core (``select_victims``, at most ``max_preemption_attempts`` per event time);
a ``preempt`` plan releases the victims and reserves the pod's slot at once (``reserve``), the pod
starts when the victims' grace ends, and the victims are requeued then with their checkpoint.

Two shortcuts keep a replay fast and change no decision: a pod whose shape is at least as large as
one that already failed in this pass is not tried again, and a pod whose preemption attempt found
nothing is not asked again until something that could change the answer happens (a release, a
lower-priority start, a minimum run time running out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpusched_core.placement import (
    GpuShare,
    MigSlice,
    Node,
    PlacementPolicy,
    PodRequest,
    WholeGpus,
    build_snapshot,
    place,
)
from gpusched_core.preemption import PreemptionPlan, Preemptor, SelectionConfig, reserve, select_victims

from .state import FINISH, REQUEUE, UNPROTECT, PodRecord, SimConfig, SimState
from .workload import SimPod

Progress = Callable[[float, int, int], None]  # (virtual now, pods arrived, pods pending)
PROGRESS_EVERY_S = 7 * 86400.0


class FailedShapes:
    """Request shapes that did not fit in this pass; a shape at least as large cannot fit either."""

    def __init__(self) -> None:
        self.failed: dict[tuple[object, ...], list[tuple[int, int, int]]] = {}

    @staticmethod
    def _split(request: PodRequest) -> tuple[tuple[object, ...], tuple[int, int, int]]:
        gpu = request.gpu
        kind, amount = ("none", 0)
        if isinstance(gpu, WholeGpus):
            kind, amount = "whole", gpu.count
        elif isinstance(gpu, GpuShare):
            kind, amount = "share", gpu.milli
        elif isinstance(gpu, MigSlice):
            kind, amount = f"mig:{gpu.profile}", 0
        group = (kind, request.allowed_models, request.node_selector)
        return group, (amount, request.cpu_milli, request.memory_mib)

    def dominated(self, request: PodRequest) -> bool:
        group, size = self._split(request)
        return any(all(s >= f for s, f in zip(size, failed, strict=True)) for failed in self.failed.get(group, ()))

    def add(self, request: PodRequest) -> None:
        group, size = self._split(request)
        self.failed.setdefault(group, []).append(size)


def _place_pending(state: SimState, pod_ids: Sequence[str]) -> list[str]:
    """Place what fits, in queue order; returns the pods that did not fit."""
    shapes, blocked = FailedShapes(), []
    for pod_id in pod_ids:
        request = state.records[pod_id].pod.request
        if shapes.dominated(request):
            blocked.append(pod_id)
            continue
        decision = place(state.snapshot, request, state.policy)
        if decision.placed:
            state.start(pod_id, decision, state.now_s)
        else:
            shapes.add(request)
            blocked.append(pod_id)
    return blocked


def _lowest_running(state: SimState) -> int:
    return min((run.pod.priority for run in state.running.values()), default=1 << 30)


def _preempt_for(state: SimState, blocked: Sequence[str], selection: SelectionConfig, asked: dict[str, int]) -> None:
    """Ask the preemption core for blocked pods, highest priority first (``blocked`` is in queue order)."""
    attempts, lowest = 0, _lowest_running(state)
    for pod_id in blocked:
        pod = state.records[pod_id].pod
        if attempts >= state.config.max_preemption_attempts or pod.priority <= lowest:
            return
        if asked.get(pod_id) == state.version:
            continue
        attempts += 1
        preemptor = Preemptor(pod_id, "openb", pod.priority, pod.request, pod.gpu_milli)
        plan = select_victims(state.snapshot, preemptor, state.running_jobs(), state.now_s, config=selection,
                              policy=state.policy)  # fmt: skip
        if plan.outcome == "fits" and plan.placement is not None:
            state.start(pod_id, plan.placement, state.now_s)
        elif plan.outcome == "preempt" and plan.placement is not None:
            _carry_out(state, pod_id, plan)
            lowest = _lowest_running(state)
        else:
            asked[pod_id] = state.version


def _carry_out(state: SimState, pod_id: str, plan: PreemptionPlan) -> None:
    """Release the victims, hold the preemptor's slot, start it when the victims' grace ends."""
    state.snapshot = reserve(state.snapshot, plan)
    stop_s = state.now_s + state.config.grace_s
    for victim in plan.victims:
        state.stop_for_preemption(victim.job_id, stop_s)
    state.version += 1
    assert plan.placement is not None
    state.start(pod_id, plan.placement, stop_s, reserved=True)


def _handle_events(state: SimState, now_s: float) -> bool:
    """Process the events due at ``now_s``; True when capacity or the queue changed."""
    changed = False
    for event in state.events.pop_due(now_s):
        if event.kind == FINISH:
            changed |= state.finish(event.item_id, event.epoch)
        elif event.kind == REQUEUE:
            state.enqueue(event.item_id)
            changed = True
        elif event.kind == UNPROTECT:
            state.version += 1
    return changed


def simulate(nodes: Sequence[Node], pods: Sequence[SimPod], policy: PlacementPolicy, config: SimConfig,
             window: tuple[float, float], progress: Progress | None = None) -> SimState:  # fmt: skip
    """Replay ``pods`` (sorted by creation time) until every pod has finished."""
    state = SimState(build_snapshot(nodes), policy, config, window)
    state.records = {pod.pod_id: PodRecord(pod, pod.work_s) for pod in pods}
    selection = SelectionConfig(default_min_runtime_s=config.min_runtime_s, min_runtime_s={"high": 0.0})
    asked: dict[str, int] = {}
    i, started_last = 0, -1.0
    while i < len(pods) or state.events:
        state.now_s = now = min(state.events.next_at(), pods[i].created_s if i < len(pods) else float("inf"))
        changed = _handle_events(state, now)
        arrivals = []
        while i < len(pods) and pods[i].created_s <= now:
            state.enqueue(pods[i].pod_id)
            arrivals.append(pods[i].pod_id)
            i += 1
        queue = [pod_id for _, pod_id in state.pending] if changed else sorted(arrivals, key=_key(state))
        _place_pending(state, queue)
        if config.preemption and state.pending:
            _preempt_for(state, [pod_id for _, pod_id in state.pending], selection, asked)
        if progress is not None and now - started_last >= PROGRESS_EVERY_S:
            started_last = now
            progress(now, i, len(state.pending))
    return state


def _key(state: SimState) -> Callable[[str], tuple[int, float, str]]:
    def key(pod_id: str) -> tuple[int, float, str]:
        pod = state.records[pod_id].pod
        return (-pod.priority, pod.created_s, pod_id)

    return key
