"""Reclaim: give a tenant under its nominal quota back the capacity of one flavor that others borrowed.

``plan_reclaim`` answers one quota ``ReclaimRequested`` for its first blocked job (pure):

1. Only jobs charged to the flavor take part: a borrower's job on another GPU model neither frees the
   flavor's GPUs nor pays back its borrowed quota. A job already stopping for another preemptor is
   that preemptor's, neither a candidate nor capacity freed for us; one already stopping for the
   blocked job is awaited (its capacity and its quota count as being freed).
2. Stale requests do nothing: when quota given back for the blocked job by earlier victims reached
   the quota service only after the request was made, the request predates it (quota asks again
   when still short).
3. Capacity: ``select_victims`` with a ``ReclaimRequest`` trigger finds the fewest borrower jobs whose
   release lets the blocked job be placed, verified with the placement engine.
4. Quota: the victims must also give back ``need_units``: what the blocked job still lacks
   (at most its own units and at most what quota says the tenant is short), less what jobs already
   stopping for it give back. When the capacity victims give back less, further borrower jobs are
   added, largest first then by the victim order (fewest extra victims), and pruned to a minimal set;
   every borrower still loses jobs only while it borrows.
5. Nothing is preempted unless both hold.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpusched_core.placement import ClusterSnapshot, PlacementPolicy
from gpusched_core.quota.units import format_gpus

from . import reasons as text
from .eligibility import Eligibility, classify
from .model import PreemptionPlan, Preemptor, ReclaimRequest, RunningJob, SelectionConfig, Victim
from .ordering import CandidateFacts, victim_order
from .select import DEFAULT_CONFIG, select_victims


@dataclass(frozen=True, slots=True)
class ReclaimAsk:
    """What quota asked for: ``short_units`` of ``flavor`` for ``tenant``, from ``borrowers`` (tenant,
    units borrowed above nominal), computed at ``requested_at_s``."""

    tenant: str
    flavor: str
    short_units: int
    borrowers: tuple[tuple[str, int], ...]
    requested_at_s: float

    def trigger(self) -> ReclaimRequest:
        return ReclaimRequest(self.tenant, tuple(self.borrowers), self.short_units, self.flavor)


@dataclass(frozen=True, slots=True)
class FreedFor:
    """A job an earlier reclaim preempted for the same blocked job, with the quota units it held and
    when its quota was given back (None: it still holds it)."""

    job_id: str
    units: int
    quota_released_at_s: float | None


def quota_need_units(ask: ReclaimAsk, job_units: int, quota_reserved: bool, freed: Sequence[FreedFor]) -> int:
    """Quota units the victims must still give back for the blocked job (0: none).

    A job whose quota is reserved needs none; otherwise at most its own units and at most the
    tenant's shortfall, less what jobs already preempted for it will give back.
    """
    if quota_reserved:
        return 0
    in_flight = sum(f.units for f in freed if f.quota_released_at_s is None)
    return max(0, min(ask.short_units, job_units) - in_flight)


def of_flavor(running: Sequence[RunningJob], flavor: str, blocked_job: str) -> tuple[list[RunningJob], Counter[str]]:
    """The running jobs that take part in a reclaim of ``flavor`` (see rule 1), and why the rest do not."""
    kept: list[RunningJob] = []
    dropped: Counter[str] = Counter()
    for job in running:
        if job.flavor != flavor:
            dropped[f"not on {flavor}"] += 1
        elif job.preempting and job.preempted_for != blocked_job:
            dropped["already stopping for another job"] += 1
        else:
            kept.append(job)
    return kept, dropped


def plan_reclaim(snapshot: ClusterSnapshot, preemptor: Preemptor, ask: ReclaimAsk, running: Sequence[RunningJob],
                 freed: Sequence[FreedFor], now_s: float, *, quota_reserved: bool = False,
                 config: SelectionConfig = DEFAULT_CONFIG, policy: PlacementPolicy | None = None) -> PreemptionPlan:
    """Whom to preempt so that ``preemptor`` (the first blocked job, ``units`` = its quota charge) gets
    both the flavor's capacity and its quota back, or why no one (``reasons[1]`` says it in a line).

    ``snapshot`` must not hold GPUs nominated for the preemptor itself (they are its own already).
    """
    lead = (f"reclaim of {format_gpus(ask.short_units)} {ask.flavor} GPU(s) for tenant {ask.tenant} "
            f"(under its nominal quota), for its job {preemptor.job_id}")
    stale = sorted(f.job_id for f in freed
                   if f.quota_released_at_s is not None and f.quota_released_at_s > ask.requested_at_s)
    if stale:
        why = (f"nothing more to reclaim: {', '.join(stale)} gave back quota for {preemptor.job_id} after this "
               f"request was made; quota asks again if the tenant is still short")
        return PreemptionPlan(preemptor.job_id, "reclaim", "await", reasons=(lead, why))
    need = quota_need_units(ask, preemptor.units, quota_reserved, freed)
    jobs, dropped = of_flavor(running, ask.flavor, preemptor.job_id)
    trigger = ask.trigger()
    capacity = select_victims(snapshot, preemptor, jobs, now_s, trigger=trigger, config=config, policy=policy)
    eligibility = classify(snapshot, preemptor, jobs, now_s, trigger, {}, config, victim_order(config.victim_order))
    if capacity.outcome == "none":
        return replace(capacity, reasons=(lead, _why_none(ask, eligibility, dropped), *capacity.reasons))
    extra = top_up(eligibility, capacity.victim_ids, need)
    if extra is None:
        freeable = sum(f.job.units for f in eligibility.candidates)
        why = (f"nothing to reclaim: the borrowers' preemptible {ask.flavor} jobs give back only "
               f"{format_gpus(freeable)} of the {format_gpus(need)} GPU(s) of quota {preemptor.job_id} lacks")
        return PreemptionPlan(preemptor.job_id, "reclaim", "none", reasons=(lead, why, *capacity.reasons))
    if capacity.outcome in ("fits", "await") and not extra:
        return replace(capacity, reasons=(lead, _why_nothing(capacity, preemptor.job_id, ask.flavor),
                                          *capacity.reasons))
    victims = (*capacity.victims, *(_victim(f, preemptor, trigger) for f in extra))
    ids = ", ".join(v.job_id for v in victims)
    summary = (f"preempting {len(victims)} job(s) of the borrowers ({ids}) to give back "
               f"{format_gpus(sum(_units(eligibility, v.job_id) for v in victims))} {ask.flavor} GPU(s) of quota")
    topped = () if not extra else (
        f"{len(extra)} more victim(s) for quota: {', '.join(f.job.job_id for f in extra)} (the capacity victims "
        f"alone give back less than the {format_gpus(need)} GPU(s) it lacks)",)
    return PreemptionPlan(preemptor.job_id, "reclaim", "preempt", victims, capacity.awaiting,
                          capacity.awaiting_allocation_ids, capacity.placement,
                          (lead, summary, *capacity.reasons, *topped), capacity.exact and not extra)


def top_up(eligibility: Eligibility, chosen_ids: Sequence[str], need_units: int) -> tuple[CandidateFacts, ...] | None:
    """The fewest further candidates (largest units first, then the victim order) whose units, with
    those of ``chosen_ids``, reach ``need_units`` within every borrower's limit, pruned so that none can
    be spared (costliest tried first); () when already enough, None when impossible."""
    chosen = [f for f in eligibility.candidates if f.job.job_id in set(chosen_ids)]
    freed = sum(f.job.units for f in chosen)
    if freed >= need_units:
        return ()
    keys = eligibility.keys
    rest = sorted((f for f in eligibility.candidates if f.job.job_id not in set(chosen_ids)),
                  key=lambda f: (-f.job.units, keys[f.job.job_id]))
    extra: list[CandidateFacts] = []
    for facts in rest:
        if freed >= need_units:
            break
        if facts.job.units > 0 and eligibility.allows([*chosen, *extra, facts]):
            extra.append(facts)
            freed += facts.job.units
    if freed < need_units:
        return None
    for facts in sorted(extra, key=lambda f: keys[f.job.job_id], reverse=True):
        if freed - facts.job.units >= need_units:  # dropping a victim never breaks a borrower's limit
            extra.remove(facts)
            freed -= facts.job.units
    return tuple(sorted(extra, key=lambda f: keys[f.job.job_id]))


def _victim(facts: CandidateFacts, preemptor: Preemptor, trigger: ReclaimRequest) -> Victim:
    job = facts.job
    return Victim(job.job_id, job.tenant, job.priority, job.allocation_ids, facts.gpu_milli, facts.lost_work_s,
                  text.victim_reason(facts, preemptor, trigger))


def _units(eligibility: Eligibility, job_id: str) -> int:
    return next((f.job.units for f in eligibility.candidates if f.job.job_id == job_id), 0)


def _why_none(ask: ReclaimAsk, eligibility: Eligibility, dropped: Counter[str]) -> str:
    if eligibility.candidates:
        return f"nothing to reclaim: no set of the borrowers' preemptible {ask.flavor} jobs makes room for it"
    borrowers = ", ".join(tenant for tenant, _ in ask.borrowers) or "none listed"
    others = "; ".join(f"{n} running job(s) {why}" for why, n in sorted(dropped.items()))
    return (f"nothing to reclaim: borrowers ({borrowers}) hold no preemptible job of {ask.flavor}"
            + (f" ({others})" if others else ""))


def _why_nothing(capacity: PreemptionPlan, job_id: str, flavor: str) -> str:
    if capacity.outcome == "await":
        return (f"nothing more to reclaim: jobs already stopping for {job_id} ({', '.join(capacity.awaiting)}) "
                f"free the room and the quota it needs")
    return (f"nothing to reclaim: {job_id} fits on free {flavor} capacity and its quota is reserved or already "
            f"being given back")
