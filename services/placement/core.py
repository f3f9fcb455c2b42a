"""First-fit placement of whole GPUs (pure). The fragmentation-aware engine is `placement.engine`."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str
    healthy: bool = True
    allocated_to: str | None = None
    nominated_for: str | None = None  # held for a preemptor while its victims stop


@dataclass(frozen=True)
class Node:
    node_id: str
    gpus: tuple[Gpu, ...]

    def free(self, model: str | None, job_id: str | None = None) -> list[Gpu]:
        """Healthy, unallocated GPUs of the model that are not held for another job than `job_id`."""
        return [g for g in self.gpus
                if g.allocated_to is None and g.healthy and (model is None or g.model == model)
                and g.nominated_for in (None, job_id)]


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]  # in a fixed order (node id), so first-fit is deterministic


@dataclass(frozen=True)
class PendingJob:
    job_id: str
    gpus: int
    gpu_model: str | None
    priority: int
    seq: int


@dataclass(frozen=True)
class Placement:
    job_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_model: str
    reason: str


@dataclass(frozen=True)
class Deferral:
    job_id: str
    reasons: tuple[str, ...]


POLICY = "firstfit"


def order_pending(pending: list[PendingJob]) -> list[PendingJob]:
    """Higher priority first, then arrival (seq), then job id."""
    return sorted(pending, key=lambda j: (-j.priority, j.seq, j.job_id))


def place_one(snapshot: Snapshot, job: PendingJob) -> Placement | Deferral:
    """The first node (by id) with enough free healthy GPUs of one allowed model; lowest indices first."""
    if not snapshot.nodes:
        return Deferral(job.job_id, ("no nodes registered",))
    counts: dict[str, int] = {}
    for node in snapshot.nodes:
        by_model: dict[str, list[Gpu]] = {}
        for gpu in node.free(job.gpu_model, job.job_id):
            by_model.setdefault(gpu.model, []).append(gpu)
        for model in sorted(by_model):
            if len(by_model[model]) >= job.gpus:
                chosen = by_model[model][: job.gpus]
                return Placement(job.job_id, node.node_id, tuple(g.index for g in chosen),
                                 tuple(g.uuid for g in chosen), model,
                                 f"{POLICY}: first node with {job.gpus} free {model} GPU(s)")
        counts[_why_not(node, job)] = counts.get(_why_not(node, job), 0) + 1
    return Deferral(job.job_id, tuple(f"{n} node(s): {why}" for why, n in sorted(counts.items())))


def _why_not(node: Node, job: PendingJob) -> str:
    if job.gpu_model is not None and not any(g.model == job.gpu_model for g in node.gpus):
        return f"no {job.gpu_model} GPUs"
    if len([g for g in node.gpus if job.gpu_model is None or g.model == job.gpu_model]) < job.gpus:
        return f"fewer than {job.gpus} GPUs{' of ' + job.gpu_model if job.gpu_model else ''} in total"
    return f"fewer than {job.gpus} free GPUs{' of ' + job.gpu_model if job.gpu_model else ''}"


def allocate(snapshot: Snapshot, placement: Placement) -> Snapshot:
    chosen = set(placement.gpu_indices)
    nodes = tuple(
        replace(node, gpus=tuple(replace(g, allocated_to=placement.job_id) if g.index in chosen else g
                                 for g in node.gpus)) if node.node_id == placement.node_id else node
        for node in snapshot.nodes
    )
    return Snapshot(nodes)


def plan_cycle(snapshot: Snapshot, pending: list[PendingJob]) -> tuple[list[Placement], list[Deferral]]:
    """Place pending jobs in order on a working copy of the snapshot; a job that does not fit does not
    stop smaller ones behind it (backfill)."""
    placements: list[Placement] = []
    deferrals: list[Deferral] = []
    for job in order_pending(pending):
        decision = place_one(snapshot, job)
        if isinstance(decision, Placement):
            placements.append(decision)
            snapshot = allocate(snapshot, decision)
        else:
            deferrals.append(decision)
    return placements, deferrals
