"""Scale decisions with hysteresis and cooldowns (pure): `plan_scaling(state, observation, now, policy)`.

Scale out (per GPU model): demand the cluster cannot place now (`unplaceable` requests, quota already
reserved) must persist for `window_s`; a dip shorter than `clear_s` does not reset that window
(hysteresis against noisy queues). The node count is what first-fit-decreasing needs to pack the
unplaceable requests onto new nodes of the model's size, less nodes already requested and not yet
arrived (in flight until the model's node count grows by them or `provision_timeout_s` passes), capped
at `max_nodes`. At most one scale-out per model per `cooldown_s`.

Scale in (per node): a node with nothing allocated, of a model with no pending demand (its own or
any-model, waiting for quota or not), empty for `scale_in_idle_s`. Every such node of a model is named in one batch; the next
batch for that model waits `scale_in_cooldown_s`; a model never drops below `min_nodes`. A node is
named once until it is used again.

No flapping: opposite decisions for one model are at least `cooldown_s` apart (a scale-in waits that
long after a scale-out and vice versa). Every decision carries the numbers that justified it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from gpusched_common import events as ev

from gpusched_core.metrics.views import ANY_MODEL, ClusterSnapshot, free_gpus_by_node


@dataclass(frozen=True)
class ScalePolicy:
    window_s: float = 60.0
    clear_s: float = 15.0
    cooldown_s: float = 300.0
    max_nodes: int = 16
    scale_in_idle_s: float = 600.0
    scale_in_cooldown_s: float = 300.0
    min_nodes: int = 0
    provision_timeout_s: float = 900.0


@dataclass(frozen=True)
class ModelDemand:
    model: str
    pending_gpus: int
    unplaceable: tuple[int, ...]  # sizes of the pending requests that fit nowhere now
    free_gpus: int
    gpus_per_node: int
    nodes: int
    queued_gpus: int = 0  # every pending request of the model, quota reserved or not


@dataclass(frozen=True)
class NodeUsage:
    node_id: str
    model: str
    pool: str
    allocated_gpus: int
    total_gpus: int


@dataclass(frozen=True)
class ScaleObservation:
    demands: tuple[ModelDemand, ...]
    nodes: tuple[NodeUsage, ...]
    any_model_pending_gpus: int = 0


@dataclass(frozen=True)
class InFlight:
    nodes: int
    requested_at: datetime
    baseline_nodes: int  # the model's node count when requested


@dataclass(frozen=True)
class ModelState:
    pressure_since: datetime | None = None
    last_high_at: datetime | None = None
    last_out_at: datetime | None = None
    last_in_at: datetime | None = None
    in_flight: tuple[InFlight, ...] = ()


@dataclass(frozen=True)
class ScalerState:
    models: Mapping[str, ModelState] = field(default_factory=dict)
    empty_since: Mapping[str, datetime] = field(default_factory=dict)
    requested_in: frozenset[str] = frozenset()


# what the scaler decides is the event autoscalers read: no value of its own mirrors it
Decision = ev.ScaleOutRequested | ev.ScaleInRequested


def nodes_to_pack(requests: tuple[int, ...], gpus_per_node: int) -> int:
    """New nodes first-fit-decreasing needs for `requests` (a request larger than a node is dropped)."""
    bins: list[int] = []
    for size in sorted((r for r in requests if 0 < r <= gpus_per_node), reverse=True):
        for i, free in enumerate(bins):
            if free >= size:
                bins[i] -= size
                break
        else:
            bins.append(gpus_per_node - size)
    return len(bins)


def observe(snapshot: ClusterSnapshot) -> ScaleObservation:
    """Demand per model: pending requests (quota reserved) first-fit-decreasing onto free GPUs per node."""
    free = free_gpus_by_node(snapshot.gpus)
    per_node: dict[str, list] = {}
    for gpu in snapshot.gpus:
        per_node.setdefault(gpu.node_id, []).append(gpu)
    models = sorted({g.model for g in snapshot.gpus} | {p.gpu_model for p in snapshot.pending if p.gpu_model})
    reserved = [p for p in snapshot.pending if p.quota_reserved]
    demands = []
    for model in models:
        requests = sorted((p.gpus for p in reserved if p.gpu_model == model), reverse=True)
        space = sorted(free.get(model, {}).values(), reverse=True)
        unplaceable = []
        for size in requests:
            slot = next((i for i, f in enumerate(space) if f >= size), None)
            if slot is None:
                unplaceable.append(size)
            else:
                space[slot] -= size
        node_sizes = [len(gs) for gs in per_node.values() if gs[0].model == model]
        queued = sum(p.gpus for p in snapshot.pending if p.gpu_model == model)
        demands.append(ModelDemand(model, sum(requests), tuple(unplaceable), sum(free.get(model, {}).values()),
                                   max(node_sizes, default=8), len(node_sizes), queued))
    nodes = tuple(NodeUsage(node_id, gs[0].model, gs[0].pool, sum(g.job_id is not None for g in gs), len(gs))
                  for node_id, gs in sorted(per_node.items()))
    any_model = sum(p.gpus for p in snapshot.pending if not p.gpu_model or p.gpu_model == ANY_MODEL)
    return ScaleObservation(tuple(demands), nodes, any_model)


def _since(now: datetime, then: datetime | None) -> float:
    return math.inf if then is None else (now - then).total_seconds()


def _scale_out(model: ModelState, demand: ModelDemand, now: datetime,
               policy: ScalePolicy) -> tuple[ModelState, ev.ScaleOutRequested | None]:
    timeout = timedelta(seconds=policy.provision_timeout_s)
    flying = tuple(f for f in model.in_flight
                   if now - f.requested_at < timeout and demand.nodes < f.baseline_nodes + f.nodes)
    model = replace(model, in_flight=flying)
    if demand.unplaceable:
        model = replace(model, last_high_at=now, pressure_since=model.pressure_since or now)
    elif model.pressure_since is not None and _since(now, model.last_high_at) >= policy.clear_s:
        model = replace(model, pressure_since=None)
    if (model.pressure_since is None or not demand.unplaceable
            or _since(now, model.pressure_since) < policy.window_s
            or _since(now, model.last_out_at) < policy.cooldown_s
            or _since(now, model.last_in_at) < policy.cooldown_s):
        return model, None
    in_flight = sum(f.nodes for f in flying)
    needed = min(policy.max_nodes, nodes_to_pack(demand.unplaceable, demand.gpus_per_node) - in_flight)
    if needed <= 0:
        return model, None
    since = model.pressure_since
    assert since is not None
    waited = _since(now, since)
    decision = ev.ScaleOutRequested(
        gpu_model=demand.model, nodes=needed,
        reason=f"{len(demand.unplaceable)} pending request(s) for {sum(demand.unplaceable)} {demand.model} GPU(s) "
               f"could not be placed for {waited:.0f}s (window {policy.window_s:.0f}s); {demand.free_gpus} free, "
               f"{in_flight} node(s) already requested; {needed} node(s) x {demand.gpus_per_node} GPUs pack them",
        pending_gpus=demand.pending_gpus, unplaceable_gpus=sum(demand.unplaceable), free_gpus=demand.free_gpus,
        gpus_per_node=demand.gpus_per_node, in_flight_nodes=in_flight, pressure_since=since, decided_at=now)
    return replace(model, last_out_at=now, in_flight=flying + (InFlight(needed, now, demand.nodes),)), decision


def _scale_in(state: ScalerState, models: dict[str, ModelState], obs: ScaleObservation, now: datetime,
              policy: ScalePolicy) -> tuple[dict[str, datetime], set[str], list[ev.ScaleInRequested]]:
    demand = {d.model: d for d in obs.demands}
    present = {n.node_id for n in obs.nodes}
    empty_since = {n: t for n, t in state.empty_since.items() if n in present}
    requested = {n for n in state.requested_in if n in present}
    decisions: list[ev.ScaleInRequested] = []
    for node in obs.nodes:
        if node.allocated_gpus > 0:
            empty_since.pop(node.node_id, None)
            requested.discard(node.node_id)
        else:
            empty_since.setdefault(node.node_id, now)
    by_model: dict[str, list[NodeUsage]] = {}
    for node in obs.nodes:
        by_model.setdefault(node.model, []).append(node)
    for model_name, nodes in sorted(by_model.items()):
        model = models.get(model_name, ModelState())
        pending = (demand[model_name].queued_gpus if model_name in demand else 0) + obs.any_model_pending_gpus
        if (pending > 0 or _since(now, model.last_out_at) < policy.cooldown_s
                or _since(now, model.last_in_at) < policy.scale_in_cooldown_s):
            continue
        keep = len(nodes) - sum(1 for n in nodes if n.node_id in requested)
        batch = []
        for node in sorted(nodes, key=lambda n: (empty_since.get(n.node_id, now), n.node_id)):
            since = empty_since.get(node.node_id)
            if since is None or node.node_id in requested or keep <= policy.min_nodes:
                continue
            idle_s = (now - since).total_seconds()
            if idle_s < policy.scale_in_idle_s:
                continue
            keep -= 1
            batch.append(ev.ScaleInRequested(
                node_id=node.node_id, gpu_model=model_name, pool=node.pool,
                reason=f"node {node.node_id} has had no allocation for {idle_s:.0f}s (threshold "
                       f"{policy.scale_in_idle_s:.0f}s) and no {model_name} work is pending; {keep} {model_name} "
                       f"node(s) remain",
                empty_since=since, idle_s=round(idle_s, 1), nodes_of_model=len(nodes), pending_gpus=pending,
                decided_at=now))
        if batch:
            requested.update(d.node_id for d in batch)
            models[model_name] = replace(model, last_in_at=now)
            decisions.extend(batch)
    return empty_since, requested, decisions


def plan_scaling(state: ScalerState, obs: ScaleObservation, now: datetime,
                 policy: ScalePolicy = ScalePolicy()) -> tuple[ScalerState, tuple[Decision, ...]]:
    models = dict(state.models)
    decisions: list[Decision] = []
    for demand in sorted(obs.demands, key=lambda d: d.model):
        models[demand.model], out = _scale_out(models.get(demand.model, ModelState()), demand, now, policy)
        if out is not None:
            decisions.append(out)
    empty_since, requested, ins = _scale_in(state, models, obs, now, policy)
    decisions.extend(ins)
    return ScalerState(models, empty_since, frozenset(requested)), tuple(decisions)
