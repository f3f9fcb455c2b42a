"""A pre-submission check (pure): would this job start now, after preempting someone, wait, or never run
here? One hypothetical job, judged against a snapshot of the live cluster by the very cores that will
decide it once it is submitted, each stage in the order a real submission meets them:

1. admission: the spec's checks (``submission.check_spec``, ``check_job``), its GPU model resolved
   (``with_resolved_model``), the tenancy's rules (``check_against_tenancy``); then the priority class
   and default time limit admission gives it;
2. quota: one reservation cycle of the tenant's cohort with the job queued last (``quota.plan_cycle``):
   the jobs already ahead of it in the queue come first; reserved, or the quota core's reason;
3. placement: one placement cycle (``placement.cycle.run_plan``) of placement's queue with the job in it,
   on the snapshot placement loads, under the live policy; and whether it could fit even an empty cluster;
4. preemption: where quota would reserve it but no node has room, the victim selection of the preemption
   service (``preemption.select_victims``, a priority trigger) on the cluster that cycle leaves.

The verdict: ``start`` (with where), ``preempt`` (with the victims), ``wait`` (every reason) or ``never``
(every reason). Nothing here reads a clock: ``now`` is an input, so the same inputs give the same verdict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from gpusched_common import events as ev

from gpusched_core import placement as engine
from gpusched_core import preemption as sel
from gpusched_core.estimates import Forward, Shape, WaitingJob, estimate_new_job, wait_words
from gpusched_core.gpu_models import ModelView
from gpusched_core.placement.cycle import (
    NodeRow,
    PendingPlacement,
    Placement,
    bound_to_charge,
    build_cluster,
    pending_from_spec,
    request_for,
    run_plan,
)
from gpusched_core.placement.feasibility import gpu_free_for
from gpusched_core.preemption.jobs import request_of
from gpusched_core.quota import BlockedWork, QuotaBook, QuotaSnapshot, Tenancy, UsageHistory, WaitCategory
from gpusched_core.quota import format_gpus, plan_cycle
from gpusched_core.quota import order_pending as quota_order
from gpusched_core.quota.jobs import QueuedJob, chargeable, priority_class_for, queued_job, to_pending
from gpusched_core.submission import (
    AdmissionLimits,
    check_against_tenancy,
    check_job,
    check_spec,
    with_default_time_limit,
    with_priority_class,
    with_resolved_model,
)

Verdict = Literal["start", "preempt", "wait", "never"]
# what the quota core says a job waits for that no amount of waiting gives it
NEVER_IN_QUOTA = frozenset({WaitCategory.NEVER_FITS, WaitCategory.UNKNOWN_TENANT, WaitCategory.PRIORITY_CLASS})
NO_TENANCY = "no tenancy is in force yet: quota reserves nothing until an operator installs one"


@dataclass(frozen=True)
class CheckInputs:
    """What the check reads, as the services that decide would read it: ``usage``, ``history`` and
    ``queued`` of the job's cohort (``stores.quota``); ``nodes``, ``snapshot`` (``stores.cluster.load_cluster``)
    and ``pending`` (placement's queue); ``running`` (``stores.running.load_running``). ``unknown_dependencies``:
    jobs it names in ``after`` that are no job of its tenant; ``waiting_on``: those that have not ended."""

    job_id: str
    spec: ev.JobSpec
    now: datetime
    policy: engine.PlacementPolicy
    limits: AdmissionLimits = AdmissionLimits()
    models: ModelView | None = None
    tenancy: Tenancy | None = None
    usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    history: Mapping[str, UsageHistory] = field(default_factory=dict)
    queued: Sequence[QueuedJob] = ()
    nodes: Sequence[NodeRow] = ()
    snapshot: engine.ClusterSnapshot | None = None
    pending: Sequence[PendingPlacement] = ()
    running: Sequence[sel.RunningJob] = ()
    selection: sel.SelectionConfig = sel.SelectionConfig()
    unknown_dependencies: tuple[str, ...] = ()
    waiting_on: tuple[str, ...] = ()
    forward: Forward | None = None  # the queue as the start-time estimator reads it; None: no estimate
    # the cohort's reserved work waiting for room (``stores.quota.blocked_work``), quota's fair margin (None: off)
    blocked: Sequence[BlockedWork] = ()
    fair_margin: float | None = None


@dataclass(frozen=True)
class Stage:
    """One stage's answer: ``ok`` (None: not reached), its reasons, and what it found (JSON values)."""

    ok: bool | None
    reasons: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    never: bool = False  # no change of the cluster's load lets it pass
    ahead: tuple[str, ...] = ()  # the jobs its cycle orders before this one (quota's)

    def document(self) -> dict[str, Any]:
        return {"ok": self.ok, "reasons": list(self.reasons), **self.facts}


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    summary: str
    reasons: tuple[str, ...]
    admission: Stage
    quota: Stage
    placement_stage: Stage
    preemption: Stage | None = None
    placement: Mapping[str, Any] | None = None
    victims: tuple[Mapping[str, Any], ...] | None = None
    estimated_start: datetime | None = None  # start, preempt: now; wait: the estimator's, if it knows
    estimated_wait_s: float | None = None
    estimate: Mapping[str, Any] | None = None  # a wait's run-time estimate and the estimator's reason

    def document(self) -> dict[str, Any]:
        """The answer of ``POST /v1/jobs:check`` and ``gpusched submit --check --json``."""
        return {"verdict": self.verdict, "summary": self.summary, "reasons": list(self.reasons),
                "stages": {"admission": self.admission.document(), "quota": self.quota.document(),
                           "placement": self.placement_stage.document(),
                           "preemption": self.preemption.document() if self.preemption is not None else None},
                "placement": dict(self.placement) if self.placement is not None else None,
                "victims": [dict(v) for v in self.victims] if self.victims is not None else None,
                "estimated_start": self.estimated_start.isoformat() if self.estimated_start is not None else None,
                "estimated_wait_s": self.estimated_wait_s,
                "estimate": dict(self.estimate) if self.estimate is not None else None}


def check_submission(inputs: CheckInputs) -> CheckResult:
    """The verdict on submitting ``inputs.spec`` now, with every reason (see the module's docstring), and
    when it would start: now for ``start`` and ``preempt``, the estimator's answer for ``wait``."""
    admission, spec = _admission(inputs)
    if spec is None:
        skipped = Stage(None, ("not reached: admission refuses the job",))
        return _result("never", admission.reasons, admission, skipped, skipped)
    return _estimated(inputs, _verdict(inputs, admission, spec), spec)


def _verdict(inputs: CheckInputs, admission: Stage, spec: ev.JobSpec) -> CheckResult:
    quota, flavor = _quota(inputs, spec)
    bound = bound_to_charge(spec, flavor)
    placement_stage, placed, after = _placement(inputs, bound)
    never = [r for stage in (quota, placement_stage) if stage.never for r in stage.reasons]
    if never:
        return _result("never", tuple(never), admission, quota, placement_stage)
    preemption = None
    if quota.ok and placed is None and after is not None:
        preemption, plan = _preemption(inputs, bound, after)
        if plan.outcome in ("preempt", "fits") and not inputs.waiting_on:
            victims = tuple({"job_id": v.job_id, "tenant": v.tenant, "priority": v.priority, "reason": v.reason}
                            for v in plan.victims)
            where = _where_decision(plan.placement, bound.gpu_model) if plan.placement is not None else None
            verdict: Verdict = "preempt" if victims else "start"
            return _result(verdict, (), admission, quota, placement_stage, preemption, where, victims or None)
    if quota.ok and placed is not None and not inputs.waiting_on:
        return _result("start", (), admission, quota, placement_stage, placement=_where(placed))
    waits = [*(admission.reasons if inputs.waiting_on else ()), *(() if quota.ok else quota.reasons),
             *(() if placement_stage.ok else placement_stage.reasons),
             *(preemption.reasons if preemption is not None and not preemption.ok else ())]
    return _result("wait", tuple(waits), admission, quota, placement_stage, preemption)


def _estimated(inputs: CheckInputs, result: CheckResult, spec: ev.JobSpec) -> CheckResult:
    """The result with its estimated start: a waiting job is put in the queue where it would wait and the
    queue's forward simulation (``estimates``) run; none while it waits on a dependency or for a tenancy."""
    if result.verdict in ("start", "preempt"):
        return replace(result, estimated_start=inputs.now, estimated_wait_s=0.0)
    if result.verdict != "wait" or inputs.forward is None or inputs.tenancy is None or inputs.waiting_on:
        return result
    share = spec.gpu_share.milli if spec.gpu_share is not None else None
    shape = Shape(spec.gpus, spec.nodes, spec.gpu_model, share, spec.mig_profile)
    flavor = result.quota.facts.get("flavor") if result.quota.ok else None
    now_s = inputs.now.timestamp()
    job = WaitingJob(inputs.job_id, spec.tenant, shape, now_s, spec.priority, None, spec.time_limit_s, flavor)
    estimate = estimate_new_job(inputs.forward, job, result.quota.ahead, now_s, inputs.tenancy)
    facts = {"runtime_s": estimate.runtime_s, "runtime_source": estimate.runtime_source, "reason": estimate.reason}
    if estimate.wait_s is None:
        return replace(result, estimate=facts)
    return replace(result, summary=f"{result.summary}; estimated start {wait_words(estimate.wait_s)}",
                   estimated_start=inputs.now + timedelta(seconds=estimate.wait_s),
                   estimated_wait_s=round(estimate.wait_s, 1), estimate=facts)


# --- the stages -------------------------------------------------------------------------------------------


def _admission(inputs: CheckInputs) -> tuple[Stage, ev.JobSpec | None]:
    """Admission's checks with every reason; the spec as admission would record it (None: refused)."""
    spec, tenancy = inputs.spec, inputs.tenancy
    reasons = list(check_spec(spec, inputs.limits, inputs.models) + check_job(inputs.job_id, spec))
    resolved = with_resolved_model(spec, inputs.models)
    if not reasons and tenancy is not None:
        reasons += check_against_tenancy(inputs.job_id, resolved, tenancy)
    reasons += [f"no job {job_id} to wait for" for job_id in inputs.unknown_dependencies]
    facts = {"tenant": spec.tenant, "gpu_model": resolved.gpu_model}
    if reasons:
        return Stage(False, tuple(reasons), facts, never=True), None
    admitted = with_priority_class(with_default_time_limit(resolved, tenancy), tenancy)
    klass = admitted.priority_class or (priority_class_for(tenancy, admitted.priority) if tenancy else None)
    facts = {**facts, "priority": admitted.priority, "priority_class": klass,
             "time_limit_s": admitted.time_limit_s, "waiting_on": list(inputs.waiting_on)}
    waits = (f"waits for the job{'s' if len(inputs.waiting_on) > 1 else ''} it runs after to end: "
             f"{', '.join(inputs.waiting_on)}",) if inputs.waiting_on else ()
    return Stage(True, waits, facts), admitted


def _quota(inputs: CheckInputs, spec: ev.JobSpec) -> tuple[Stage, str | None]:
    """One cycle of the cohort's queue with the job last in: its reservation's flavor, or the reason."""
    tenancy = inputs.tenancy
    if tenancy is None:
        return Stage(False, (NO_TENANCY,)), None
    now_s = inputs.now.timestamp()
    mine = to_pending(tenancy, queued_job(inputs.job_id, spec, now_s))
    if isinstance(mine, str):
        return Stage(False, (mine,), never=True), None
    queue, _ = chargeable(tenancy, [q for q in inputs.queued if q.job_id != inputs.job_id])
    snapshot = QuotaSnapshot(tenancy, inputs.usage, inputs.history, now_s)
    order = quota_order(snapshot, [*queue, mine])
    ahead = order[:order.index(inputs.job_id)]
    plan = plan_cycle(snapshot, [*queue, mine], blocked=inputs.blocked, fair_margin=inputs.fair_margin)
    reserved = next((r for r in plan.reservations if r.job_id == inputs.job_id), None)
    flavor, units = (reserved.flavor, reserved.units) if reserved is not None else mine.ask.options[0]
    facts = {"tenant": mine.tenant, "flavor": flavor, "gpus": format_gpus(units),
             **_ledger(QuotaBook.from_usage(tenancy, inputs.usage), mine.tenant, flavor),
             "queued_ahead": len(ahead), "reserved_ahead": sorted(r.job_id for r in plan.reservations
                                                                  if r.job_id in set(ahead))}
    if reserved is not None:
        borrowed = f", {format_gpus(reserved.borrowed_units)} of it borrowed" if reserved.borrowed_units else ""
        return Stage(True, (f"quota would reserve {format_gpus(units)} {flavor} for tenant {mine.tenant}{borrowed}",),
                     {**facts, "borrowed_gpus": format_gpus(reserved.borrowed_units)}), flavor
    waiting = next(w for w in plan.waiting if w.job_id == inputs.job_id)
    first = facts["reserved_ahead"]
    behind = (f"quota reserves first what the tenant's cohort queued ahead of it: {', '.join(first)}",) if first else ()
    return Stage(False, (waiting.reason, *behind), {**facts, "position": waiting.position,
                                                    "category": waiting.category.value},
                 never=waiting.category in NEVER_IN_QUOTA, ahead=tuple(ahead)), None


def _ledger(book: QuotaBook, tenant: str, flavor: str) -> dict[str, Any]:
    limit = book.borrowing_limit(tenant, flavor)
    nominal = book.nominal(tenant, flavor)
    return {"used_gpus": format_gpus(book.used(tenant, flavor)), "nominal_gpus": format_gpus(nominal),
            "limit_gpus": format_gpus(nominal + limit) if limit is not None else None}


def _placement(inputs: CheckInputs, spec: ev.JobSpec) -> tuple[Stage, Placement | None, engine.ClusterSnapshot | None]:
    """One placement cycle of placement's queue with the job in it: its placement or why not, and the
    cluster the cycle leaves; ``never`` when not even an empty cluster could host it."""
    nodes = list(inputs.nodes)
    if inputs.snapshot is None or not nodes:
        return Stage(False, ("no node is ready: none has registered, or every one is lost or cordoned",),
                     {"policy": inputs.policy.name}), None, None
    seq = max((p.seq for p in inputs.pending), default=0) + 1
    mine = pending_from_spec(inputs.job_id, spec, seq, inputs.now)
    queue = [p for p in inputs.pending if p.job_id != inputs.job_id]
    placements, deferrals, after = run_plan(inputs.snapshot, [*queue, mine], inputs.policy, nodes)
    placed = next((p for p in placements if p.job_id == inputs.job_id), None)
    first = [p.job_id for p in placements if p.job_id != inputs.job_id]
    facts: dict[str, Any] = {"policy": inputs.policy.name, "placed_ahead": first}
    if placed is not None:
        return Stage(True, (f"fits now on {_nodes_text(_where(placed))}",), facts), placed, after
    request = request_for(mine)
    idle = build_cluster(nodes, {}, {})
    empty = engine.place(idle, request, inputs.policy)
    if not empty.placed:
        head = _never_text(idle, request, spec, empty)
        return Stage(False, (head, *(r for r in empty.reasons[1:] if r not in head)), facts, never=True), None, after
    deferral = next(d for d in deferrals if d.job_id == inputs.job_id)
    head = _no_room_text(inputs.snapshot, request, spec, deferral.reasons)
    reasons = [head, *(r for r in deferral.reasons if r not in head)]
    if first:
        reasons.append(f"{len(first)} job{'s' if len(first) > 1 else ''} waiting ahead of it in placement's queue "
                       f"would be placed first: {', '.join(first)}")
    return Stage(False, tuple(reasons), facts), None, after


def _preemption(inputs: CheckInputs, spec: ev.JobSpec,
                snapshot: engine.ClusterSnapshot) -> tuple[Stage, sel.PreemptionPlan]:
    """The preemption service's choice for the job, were placement to defer it now (a priority trigger)."""
    tenant = inputs.tenancy.charged_tenant(spec.tenant) if inputs.tenancy is not None else spec.tenant
    preemptor = sel.Preemptor(inputs.job_id, tenant, spec.priority, request_of(inputs.job_id, spec))
    plan = sel.select_victims(snapshot, preemptor, inputs.running, inputs.now.timestamp(), config=inputs.selection)
    facts = {"outcome": plan.outcome, "victims": list(plan.victim_ids), "awaiting": list(plan.awaiting)}
    return Stage(plan.outcome in ("preempt", "fits"), tuple(r for r in plan.reasons if r), facts), plan


# --- words ------------------------------------------------------------------------------------------------


def _result(verdict: Verdict, reasons: tuple[str, ...], admission: Stage, quota: Stage, placement_stage: Stage,
            preemption: Stage | None = None, placement: Mapping[str, Any] | None = None,
            victims: tuple[Mapping[str, Any], ...] | None = None) -> CheckResult:
    if verdict == "start":
        summary = f"would start now on {_nodes_text(placement)}" if placement else "would start now"
    elif verdict == "preempt":
        ids = ", ".join(v["job_id"] for v in victims or ())
        count = len(victims or ())
        where = f" on {_nodes_text(placement)}" if placement else ""
        jobs = f"{count} job{'s' if count != 1 else ''}"
        summary = f"would start after preempting {jobs} ({ids}) of lower priority{where}"
    elif verdict == "wait":
        summary = f"would wait: {reasons[0]}" if reasons else "would wait"
    else:
        summary = f"can never run here: {reasons[0]}" if reasons else "can never run here"
    return CheckResult(verdict, summary, reasons, admission, quota, placement_stage, preemption, placement, victims)


def _where(placed: Placement) -> dict[str, Any]:
    members = [{"node_id": m.node_id, "gpu_indices": list(m.gpu_indices)} for m in placed.all_members]
    mig = {"profile": placed.mig_profile, "start": placed.mig_start} if placed.mig_profile is not None else None
    return {"node_id": placed.node_id, "gpu_indices": list(placed.gpu_indices), "gpu_model": placed.gpu_model,
            "mig": mig, "share_milli": placed.share_milli, "members": members if len(members) > 1 else None}


def _where_decision(decision: engine.Decision, model: str | None) -> dict[str, Any]:
    """Where a verified preemption plan puts the job (its reserved slot)."""
    members = [{"node_id": str(b.node_id), "gpu_indices": list(b.gpu_indices)} for b in decision.bindings]
    first = decision.bindings[0]
    mig = {"profile": first.mig.profile, "start": first.mig.start} if first.mig is not None else None
    share = first.gpu_milli if 0 < first.gpu_milli < engine.MILLI_PER_GPU else None
    return {"node_id": str(first.node_id), "gpu_indices": list(first.gpu_indices), "gpu_model": model, "mig": mig,
            "share_milli": share, "members": members if len(members) > 1 else None}


def _nodes_text(where: Mapping[str, Any] | None) -> str:
    """``n7 GPUs 0-3``; a gang's every member; a MIG slice or share said as such."""
    if where is None:
        return "?"
    members = where["members"] or [{"node_id": where["node_id"], "gpu_indices": where["gpu_indices"]}]
    text = ", ".join(f"{m['node_id']} {_gpus_text(m['gpu_indices'])}" for m in members)
    if where["mig"] is not None:
        text += f" (MIG {where['mig']['profile']} at slice {where['mig']['start']})"
    elif where["share_milli"] is not None:
        text += f" ({where['share_milli']} milli of it)"
    return text


def _gpus_text(indices: Sequence[int]) -> str:
    """``GPU 2``, ``GPUs 0-3``, ``GPUs 0,2,5-7``: runs of consecutive indices as ranges."""
    runs: list[list[int]] = []
    for i in sorted(indices):
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs]
    return f"GPU{'s' if len(indices) > 1 else ''} {','.join(parts)}"


def _whole(request: engine.PodRequest | engine.GangRequest) -> engine.PodRequest | None:
    """The one node's (a gang's first member's) request when it asks for whole GPUs, else None."""
    member = request.member(0) if isinstance(request, engine.GangRequest) else request
    return member if isinstance(member.gpu, engine.WholeGpus) else None


def _most_free(snapshot: engine.ClusterSnapshot, request: engine.PodRequest) -> int:
    """The most fully free GPUs the request may use on any one node."""
    free = (gpu_free_for(snapshot, request) == engine.MILLI_PER_GPU).sum(axis=1)
    return int(free.max()) if free.size else 0


def _shape_text(spec: ev.JobSpec) -> tuple[int, str]:
    model = spec.gpu_model or "any model"
    return spec.gpus, f"GPU{'s' if spec.gpus > 1 else ''} of {model}"


def _never_text(empty: engine.ClusterSnapshot, request: engine.PodRequest | engine.GangRequest,
                spec: ev.JobSpec, decision: engine.Decision) -> str:
    """Why not even an empty cluster hosts it: too few GPUs on any node, else the checks nodes fail."""
    whole = _whole(request)
    count, shape = _shape_text(spec)
    if whole is not None and (most := _most_free(empty, whole)) < count:
        if spec.nodes > 1:
            return f"fewer than {spec.nodes} nodes have {count} {shape} each (the most on a node is {most})"
        return f"no node has {count} {shape} (the most on a node is {most})"
    return f"no node could ever host it: {_classes_text(decision)}"


def _no_room_text(snapshot: engine.ClusterSnapshot, request: engine.PodRequest | engine.GangRequest,
                  spec: ev.JobSpec, reasons: Sequence[str]) -> str:
    """Why no node has room now: too few free GPUs on any node, else the checks nodes fail now."""
    whole = _whole(request)
    count, shape = _shape_text(spec)
    if whole is not None and (most := _most_free(snapshot, whole)) < count:
        where = f"on each of {spec.nodes} nodes" if spec.nodes > 1 else "on one node"
        return f"no free capacity: needs {count} {shape} {where}, the most free on a node is {most}"
    return f"no free capacity: {'; '.join(reasons) or 'no node has room for it now'}"


def _classes_text(decision: engine.Decision) -> str:
    return "; ".join(str(r) for r in decision.unplaced_by_class) or "; ".join(decision.reasons)
