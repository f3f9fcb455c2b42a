"""Victims for the simulator's preemptions (a stand-in for the preemption service; pure selection).

Two triggers: a quota ``ReclaimRequest`` (a tenant under its nominal quota while others borrow) and
least-attained-service (a first-queue job blocked while second-queue jobs run). Each looks for runs
whose preemption lets one job start now: room in its tenant's quota and a place on the nodes. A
victim's tenant must be borrowing when it is chosen (or be the blocked job's own tenant, for LAS), so
no tenant is pushed below its nominal quota by someone else's work.
"""

from __future__ import annotations

from gpusched_core.quota import UNITS_PER_GPU, QuotaBook, QuotaSnapshot, ReclaimRequest, dominant_shares

from .cluster import FLAVOR, gang_parts
from .state import Run, SimState


def reclaim_victims(state: SimState, request: ReclaimRequest) -> list[Run]:
    """Borrowers' runs whose preemption lets the request's first job start now (``make_room``). When
    no set of borrowers' runs can also make a place on the nodes for it, only quota is reclaimed:
    the fewest GPUs that cover the request's units (``quota_victims``)."""
    job = state.jobs[request.for_jobs[0]].job
    borrowers = {b for b, _ in request.borrowers}
    pool = [r for r in state.running.values() if r.tenant in borrowers and r.start_s < state.now_s]
    room = make_room(state, job.tenant, job.gpus, job.gpus * UNITS_PER_GPU, pool, pool)
    return room if room is not None else quota_victims(state, request)


def quota_victims(state: SimState, request: ReclaimRequest) -> list[Run]:
    """Borrowers' runs, most-borrowing tenant first, until the request's units are covered, each time
    the smallest run that covers what is still needed, else the largest (ties: most attained, newest).
    May cover only part of it (then the rest waits for releases)."""
    victims: list[Run] = []
    need = request.units
    for borrower, _ in request.borrowers:
        nominal = state.tenancy.nominal_units(borrower, FLAVOR)
        held = state.used(borrower)
        runs = sorted((r for r in state.running.values() if r.tenant == borrower and r.start_s < state.now_s),
                      key=lambda r: (-state.attained(r), -r.start_s, r.job_id))
        while runs and need > 0 and held > nominal:
            run = _fewest_gpus(runs, need)
            runs.remove(run)
            victims.append(run)
            held -= run.units
            need -= run.units
    return victims


def las_victims(state: SimState, tenant: str, gpus: int, units: int, threshold_gpu_s: float,
                fair_gangs: bool = False) -> list[Run] | None:
    """Second-queue runs whose preemption lets a first-queue job of ``tenant`` start, or None.

    First the tenant's own second-queue runs (most attained first) until its quota fits the job, then,
    for capacity, the node(s) that need the fewest preempted GPUs; a run of another tenant is a
    candidate only while that tenant borrows. With ``fair_gangs``, a job of a whole node or more takes
    runs only from its own tenant or from tenants whose dominant share is above its tenant's: such
    jobs run long, so attained service says little about which of two should go first, and their
    victims need whole nodes again to resume; fair share decides instead."""
    demoted = [r for r in state.running.values() if state.attained(r) >= threshold_gpu_s and r.start_s < state.now_s]
    if fair_gangs and gpus >= state.cluster.gpus_per_node and demoted:
        shares = dominant_shares(QuotaSnapshot(state.tenancy, state.usage, state.history, state.now_s))
        mine = shares.get(tenant, 0.0)
        demoted = [r for r in demoted if r.tenant == tenant or shares.get(r.tenant, 0.0) > mine]
    if not demoted:
        return None
    book = QuotaBook.from_usage(state.tenancy, state.usage)
    free = list(state.cluster.free)
    victims: list[Run] = []
    own = sorted((r for r in demoted if r.tenant == tenant), key=lambda r: (-state.attained(r), r.job_id))
    for run in own:
        if units <= book.available(tenant, FLAVOR):
            break
        _take(run, victims, book, free)
    if units > book.available(tenant, FLAVOR):
        return None
    for run in _capacity_victims(state, book, free, demoted, victims, tenant, gpus) or ():
        _take(run, victims, book, free)
    if units > book.available(tenant, FLAVOR) or not fits(free, gpus, state.cluster.gpus_per_node):
        return None
    return victims


def make_room(state: SimState, tenant: str, gpus: int, units: int, quota_pool: list[Run],
              capacity_pool: list[Run]) -> list[Run] | None:
    """Runs to preempt so that a job of ``gpus`` (``units``) of ``tenant`` fits both the nodes and its
    quota, or None when no such set exists (a preemption that starts nothing only strands its
    victims). First the nodes that need the fewest preempted GPUs (from ``capacity_pool``), then, while
    quota is short, the run of ``quota_pool`` that covers the rest with the fewest GPUs."""
    book = QuotaBook.from_usage(state.tenancy, state.usage)
    free = list(state.cluster.free)
    victims: list[Run] = []
    if not fits(free, gpus, state.cluster.gpus_per_node):
        picked = _capacity_victims(state, book, free, capacity_pool, victims, tenant, gpus)
        if picked is None:
            return None
        for run in picked:
            _take(run, victims, book, free)
    taken = {r.job_id for r in victims}
    left = sorted((r for r in quota_pool if r.job_id not in taken), key=lambda r: (-state.attained(r), r.job_id))
    while units > book.available(tenant, FLAVOR):
        eligible = [r for r in left if r.tenant == tenant or book.borrowed(r.tenant, FLAVOR) > 0]
        if not eligible:
            return None
        run = _fewest_gpus(eligible, units - book.available(tenant, FLAVOR))
        left.remove(run)
        _take(run, victims, book, free)
    return victims


def _fewest_gpus(runs: list[Run], need: float) -> Run:
    """The smallest run that covers ``need`` units, else the largest; ties go to the first in ``runs``."""
    covering = [r for r in runs if r.units >= need]
    return min(covering, key=lambda r: r.units) if covering else max(runs, key=lambda r: r.units)


def _take(run: Run, victims: list[Run], book: QuotaBook, free: list[int]) -> None:
    victims.append(run)
    book.charge(run.tenant, FLAVOR, -run.units)
    for binding in run.bindings:
        free[binding.node] += len(binding.gpu_indices)


def _capacity_victims(state: SimState, book: QuotaBook, free: list[int], demoted: list[Run], taken: list[Run],
                      tenant: str, gpus: int) -> list[Run] | None:
    """Runs to preempt so that the job's parts fit on the cheapest nodes (fewest GPUs preempted)."""
    parts = sorted(gang_parts(gpus, state.cluster.gpus_per_node), reverse=True)
    chosen = {r.job_id for r in taken}
    by_node: dict[int, list[Run]] = {}
    for run in demoted:
        if run.job_id in chosen or len(run.bindings) != 1:
            continue  # gangs are not split to make room
        if run.tenant == tenant or book.borrowed(run.tenant, FLAVOR) >= run.units:
            by_node.setdefault(run.bindings[0].node, []).append(run)
    options = []
    for node, f in enumerate(free):
        runs = sorted(by_node.get(node, ()), key=lambda r: (-r.units, -state.attained(r), r.job_id))
        need, picked = parts[0] - f, []
        for run in runs:
            if need <= 0:
                break
            picked.append(run)
            need -= run.units // UNITS_PER_GPU
        if need <= 0:
            options.append((sum(r.units for r in picked), node, picked))
    if len(options) < len(parts):
        return None
    options.sort(key=lambda o: (o[0], o[1]))
    return [run for _, _, picked in options[: len(parts)] for run in picked]


def fits(free: list[int], gpus: int, per_node: int) -> bool:
    parts = gang_parts(gpus, per_node)
    if len(parts) == 1:
        return max(free) >= gpus
    ranked = sorted(free, reverse=True)
    return len(ranked) >= len(parts) and all(f >= p for f, p in zip(ranked, sorted(parts, reverse=True)))
