"""One placement cycle on the placement engine (pure): pending jobs and the cluster's rows in, placements
and deferrals out.

The live service (services/placement) rebuilds the engine's snapshot from PostgreSQL once per cycle (not
per job), places the pending jobs in order on it under the configured policy, and applies each placement
to the snapshot before the next job, so a cycle never hands out a GPU twice. The preemption service builds
its placement requests and cluster view with the same functions, so both judge a job's shape alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from gpusched_common.events import JobSpec
from gpusched_common.resources import canonical_model

from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core.placement.model import CONTAINERS_LABEL

_NEVER = datetime.max.replace(tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class PendingPlacement:
    """A job waiting for placement: ``gpus`` whole GPUs on each of ``nodes`` nodes (a gang when > 1), or a
    share of one GPU (``share_milli`` and ``share_memory_mib``), or one MIG slice of ``mig_profile``."""

    job_id: str
    gpus: int
    gpu_model: str | None
    priority: int
    seq: int  # arrival at placement
    submitted_at: datetime | None = None
    nodes: int = 1
    share_milli: int | None = None
    share_memory_mib: int = 0
    mig_profile: str | None = None
    cpu_milli: int = 0  # host CPU and memory on each node
    memory_mib: int = 0
    node_selector: tuple[tuple[str, str], ...] = ()  # labels each node must carry (``required_labels``)


def required_labels(spec: JobSpec) -> tuple[tuple[str, str], ...]:
    """The node labels a job needs, sorted: its ``node_selector``, and a container runtime for an image."""
    labels = dict(spec.node_selector)
    if spec.image is not None:
        labels[CONTAINERS_LABEL] = "true"
    return tuple(sorted(labels.items()))


def charged_model(named: str | None, charged: str | None) -> str | None:
    """The GPU model a job runs on: the one its quota reservation was charged for when that is a GPU model
    (the reservation binds the job to it; a flavor that is no model, such as a MIG family, does not), else
    the one its spec names (None: any). The one home of this rule: placement queues (and requeues) a job
    with it, and the metrics service counts a waiting job's GPUs by it."""
    return (canonical_model(charged) if charged else None) or named


def bound_to_charge(spec: JobSpec, charged: str | None) -> JobSpec:
    """The spec bound to the model its reservation was charged for (``charged_model``)."""
    model = charged_model(spec.gpu_model, charged)
    return spec if model == spec.gpu_model else spec.model_copy(update={"gpu_model": model})


def pending_from_spec(job_id: str, spec: JobSpec, seq: int = 0, submitted_at: datetime | None = None) -> PendingPlacement:
    share = spec.gpu_share
    return PendingPlacement(job_id, spec.gpus, spec.gpu_model, spec.priority, seq, submitted_at, spec.nodes,
                      share.milli if share else None, share.memory_mib if share else 0, spec.mig_profile,
                      spec.cpu_milli, spec.memory_mib, required_labels(spec))


@dataclass(frozen=True)
class Member:
    """One node of a placement: the GPUs it got there."""

    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    """Where a job goes. ``node_id``/``gpu_indices``/``gpu_uuids`` are its first (for a gang: rank 0)
    member; ``members`` lists every node of a gang (empty for a single node). A share or a MIG slice
    says what part of the GPU it got. ``cpu_milli`` / ``memory_mib``: host resources held on each node."""

    job_id: str
    node_id: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    gpu_model: str
    reason: str
    members: tuple[Member, ...] = ()
    share_milli: int | None = None
    share_memory_mib: int | None = None
    mig_profile: str | None = None
    mig_start: int | None = None
    mig_memory_slices: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def all_members(self) -> tuple[Member, ...]:
        return self.members or (Member(self.node_id, self.gpu_indices, self.gpu_uuids),)

    def command(self, policy: str) -> lifecycle.Place:
        """The job's ``Place`` command (what ``JobPlaced`` is built from), the one translation of a placement."""
        members = tuple(lifecycle.Member(m.node_id, m.gpu_indices, m.gpu_uuids) for m in self.members)
        return lifecycle.Place(self.node_id, self.gpu_indices, self.gpu_uuids, self.gpu_model, policy, self.reason,
                               members=members, share_milli=self.share_milli,
                               share_memory_mib=self.share_memory_mib, mig_profile=self.mig_profile,
                               mig_start=self.mig_start)


@dataclass(frozen=True, slots=True)
class Deferral:
    job_id: str
    reasons: tuple[str, ...]


def order_pending(pending: list[PendingPlacement]) -> list[PendingPlacement]:
    """Higher priority first, then submission time (jobs without one last), then arrival, then job id."""
    return sorted(pending, key=lambda j: (-j.priority, j.submitted_at is None, j.submitted_at or _NEVER, j.seq,
                                          j.job_id))


@dataclass(frozen=True)
class GpuRow:
    index: int
    uuid: str
    model: str
    memory_mib: int
    healthy: bool = True
    mig_enabled: bool = False
    nvlink_domain: str | None = None


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    cpu_milli: int
    memory_mib: int
    gpus: tuple[GpuRow, ...]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Held:
    """One GPU (or part of one) a job holds: a whole GPU, a share (``milli`` < 1000, ``memory_mib``) or a
    MIG instance of ``mig_profile`` starting at memory slice ``mig_start``; and the host CPU and memory
    the job holds on that node when this is its first GPU there (else 0)."""

    node_id: str
    gpu_index: int
    milli: int = engine.MILLI_PER_GPU
    memory_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None
    host_cpu_milli: int = 0
    host_memory_mib: int = 0


def nomination_id(job_id: str) -> str:
    return f"nominated-for/{job_id}"


def build_cluster(nodes: list[NodeRow], allocations: Mapping[str, Sequence[Held | tuple[str, int]]],
                  nominations: Mapping[str, Sequence[Held | tuple[str, int]]]) -> engine.ClusterSnapshot:
    """The engine snapshot: nodes with their GPUs, every job's allocation (whole GPUs as ``(node, index)``
    pairs or ``Held`` rows, shares and MIG instances as ``Held``), and what is held for a preemptor (an
    allocation of its own, released only for that preemptor). A hold that does not fit the cluster as it is
    (its victim still holds part of it, the node changed since) is left out: it counts once it fits, and
    never stops the cluster from loading."""
    snapshot = engine.build_snapshot(
        engine.Node(id=engine.NodeId(n.node_id), cpu_milli=n.cpu_milli, memory_mib=n.memory_mib,
                    labels=dict(n.labels), gpus=_engine_gpus(n))
        for n in sorted(nodes, key=lambda n: n.node_id))
    snapshot = engine.apply_many(snapshot, ((engine.RequestId(i), bindings_of(h)) for i, h in sorted(allocations.items())))
    for job_id, held in sorted(nominations.items()):
        try:
            snapshot = engine.apply_bindings(snapshot, engine.RequestId(nomination_id(job_id)), bindings_of(held))
        except engine.PlacementError:
            continue
    return snapshot


def _engine_gpus(node: NodeRow) -> tuple[engine.Gpu, ...]:
    domains: dict[str, int] = {}  # NVLink domains by name, numbered per node
    return tuple(
        engine.Gpu(g.index, g.model, g.memory_mib, g.uuid, g.healthy,
                   None if g.nvlink_domain is None else domains.setdefault(g.nvlink_domain, len(domains)),
                   g.mig_enabled)
        for g in node.gpus)


def bindings_of(held: Sequence[Held | tuple[str, int]]) -> list[engine.Binding]:
    """Engine bindings of what one job holds: its whole GPUs grouped per node, each share and MIG
    instance on its own."""
    whole: dict[str, list[int]] = {}
    host: dict[str, tuple[int, int]] = {}  # host CPU and memory of the whole GPUs' binding per node
    parts: list[engine.Binding] = []
    for item in held:
        h = item if isinstance(item, Held) else Held(item[0], item[1])
        node = engine.NodeId(h.node_id)
        if h.mig_profile is not None:
            parts.append(engine.Binding(node, (h.gpu_index,), mig=engine.MigPlacement(h.mig_profile, h.mig_start or 0),
                                        cpu_milli=h.host_cpu_milli, memory_mib=h.host_memory_mib))
        elif h.milli < engine.MILLI_PER_GPU:
            parts.append(engine.Binding(node, (h.gpu_index,), gpu_milli=h.milli, gpu_memory_mib=h.memory_mib,
                                        cpu_milli=h.host_cpu_milli, memory_mib=h.host_memory_mib))
        else:
            whole.setdefault(h.node_id, []).append(h.gpu_index)
            cpu, memory = host.get(h.node_id, (0, 0))
            host[h.node_id] = (cpu + h.host_cpu_milli, memory + h.host_memory_mib)
    return [*(engine.Binding(engine.NodeId(node), tuple(sorted(indices)), gpu_milli=engine.MILLI_PER_GPU,
                             cpu_milli=host[node][0], memory_mib=host[node][1])
              for node, indices in sorted(whole.items())), *parts]


def request_for(job: PendingPlacement) -> engine.PodRequest | engine.GangRequest:
    models = frozenset({job.gpu_model}) if job.gpu_model else frozenset()
    request_id = engine.RequestId(job.job_id)
    host = {"cpu_milli": job.cpu_milli, "memory_mib": job.memory_mib, "node_selector": job.node_selector}
    if job.share_milli is not None:
        if job.share_milli >= engine.MILLI_PER_GPU:
            return engine.PodRequest(id=request_id, gpu=engine.WholeGpus(1), allowed_models=models, **host)
        return engine.PodRequest(id=request_id, gpu=engine.GpuShare(job.share_milli, job.share_memory_mib),
                                 allowed_models=models, **host)
    if job.mig_profile is not None:
        return engine.PodRequest(id=request_id, gpu=engine.MigSlice(job.mig_profile), allowed_models=models, **host)
    if job.nodes > 1:
        return engine.GangRequest(id=request_id, node_count=job.nodes, gpus_per_node=job.gpus,
                                  cpu_milli_per_node=job.cpu_milli, memory_mib_per_node=job.memory_mib,
                                  allowed_models=models, node_selector=job.node_selector)
    return engine.PodRequest(id=request_id, gpu=engine.WholeGpus(job.gpus), allowed_models=models, **host)


def shape_of(job: PendingPlacement) -> tuple | None:
    """What a single-node job's request is made of besides its id (``request_for`` of two jobs with equal
    shapes differs only in the id); None for a gang, whose members are placed one by one."""
    if job.nodes > 1 and job.share_milli is None and job.mig_profile is None:
        return None
    return (job.gpus, job.gpu_model, job.share_milli, job.share_memory_mib, job.mig_profile, job.cpu_milli,
            job.memory_mib, job.node_selector)


def plan_cycle(snapshot: engine.ClusterSnapshot, pending: list[PendingPlacement], policy: engine.PlacementPolicy,
               nodes: list[NodeRow]) -> tuple[list[Placement], list[Deferral]]:
    """Place pending jobs in order (priority, arrival, id); one that does not fit does not stop smaller
    ones behind it. GPUs nominated for a job are offered to that job only. A gang is placed whole or
    not at all."""
    placements, deferrals, _ = run_plan(snapshot, pending, policy, nodes)
    return placements, deferrals


def run_plan(snapshot: engine.ClusterSnapshot, pending: list[PendingPlacement], policy: engine.PlacementPolicy,
             nodes: list[NodeRow]) -> tuple[list[Placement], list[Deferral], engine.ClusterSnapshot]:
    """``plan_cycle``, also returning the snapshot with every placement applied."""
    gpus = {(n.node_id, g.index): g for n in nodes for g in n.gpus}
    placements: list[Placement] = []
    deferrals: list[Deferral] = []
    # A single-node request that found no room on this very snapshot finds none again (the same inputs give
    # the same decision): the jobs of the same shape behind it are deferred with its reasons, without the
    # search and the per-class explanation (thousands of waiting jobs of a few shapes in a full cluster).
    # Any placement makes a new snapshot, and with it forgets these.
    no_room: dict[tuple, tuple[str, ...]] = {}
    no_room_on: engine.ClusterSnapshot | None = None
    for job in order_pending(pending):
        held = engine.RequestId(nomination_id(job.job_id))
        view = engine.release(snapshot, held) if held in snapshot.allocations else snapshot
        shape = shape_of(job)
        if shape is not None and view is snapshot and no_room_on is snapshot and shape in no_room:
            deferrals.append(Deferral(job.job_id, no_room[shape]))
            continue
        decision = engine.place(view, request_for(job), policy)
        if not decision.placed:
            reasons = tuple(str(r) for r in decision.unplaced_by_class) or decision.reasons
            if decision.unplaced_by_class and decision.reasons and decision.reasons[0].startswith("gang"):
                reasons = (decision.reasons[0], *reasons)
            deferrals.append(Deferral(job.job_id, reasons))
            if shape is not None and view is snapshot:
                if no_room_on is not snapshot:
                    no_room, no_room_on = {}, snapshot
                no_room[shape] = reasons
            continue
        snapshot = engine.apply(view, decision)
        placements.append(placement_of(job, decision, gpus))
    return placements, deferrals, snapshot


def placement_of(job: PendingPlacement, decision: engine.Decision, gpus: Mapping[tuple[str, int], GpuRow]) -> Placement:
    members = tuple(Member(str(b.node_id), tuple(b.gpu_indices),
                           tuple(gpus[(str(b.node_id), i)].uuid for i in b.gpu_indices)) for b in decision.bindings)
    first, binding = members[0], decision.bindings[0]
    model = gpus[(first.node_id, first.gpu_indices[0])].model
    mig = binding.mig
    slices = None
    if mig is not None:
        profile = engine.mig_profile(model, mig.profile)
        slices = profile.memory_slices if profile else None
    share = binding.gpu_milli if 0 < binding.gpu_milli < engine.MILLI_PER_GPU else None
    return Placement(
        job.job_id, first.node_id, first.gpu_indices, first.gpu_uuids, model, "; ".join(decision.reasons),
        members=members if len(members) > 1 else (),
        share_milli=share, share_memory_mib=binding.gpu_memory_mib if share is not None else None,
        mig_profile=mig.profile if mig else None, mig_start=mig.start if mig else None, mig_memory_slices=slices,
        cpu_milli=binding.cpu_milli, memory_mib=binding.memory_mib)
