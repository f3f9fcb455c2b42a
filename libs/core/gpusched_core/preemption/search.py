"""Finding the fewest victims.

A single-node request can only use what is freed on the node it lands on, so the global minimum is
the minimum over nodes of each node's minimum. Per node the search is exact: victim sets of size 1,
2, ... drawn from the node's candidates, pruned by a cheap resource total and by tenant limits, each
checked with the placement engine on a one-node copy; among the sets of the smallest size that fit,
``ordering.set_cost`` picks the cheapest. When a node has too many combinations (caps in
``SelectionConfig``) it falls back to greedy in preference order, then drops every victim that is not
needed (still minimal: no single victim can be spared), and the plan says it is not proven exact.

A gang preemptor needs ``node_count`` distinct nodes: each node's cheapest option for one member,
the best nodes first; the union is verified with ``place_gang`` and then pruned the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpusched_core.placement import PodRequest

from .eligibility import Eligibility
from .model import SelectionConfig
from .nodeview import Footprint, NodeView
from .ordering import CandidateFacts, set_cost


@dataclass(frozen=True)
class NodeOption:
    """The cheapest victims on one node that let the request fit there (none: it fits already)."""

    row: int
    node_id: str
    victims: tuple[CandidateFacts, ...]
    cost: tuple[int, tuple[tuple[object, ...], ...]]
    exact: bool

    @property
    def rank(self) -> tuple[object, ...]:
        return (self.cost, self.row)


class _Budget(Exception):
    """The exact search of one node hit a cap."""


@dataclass
class _NodeSearch:
    view: NodeView
    request: PodRequest
    candidates: Sequence[CandidateFacts]
    base: tuple[str, ...]
    eligibility: Eligibility
    config: SelectionConfig

    def __post_init__(self) -> None:
        self.freed = [self.view.footprint_of(c.job.allocation_ids) for c in self.candidates]
        self.base_freed = self.view.footprint_of(self.base)
        self.combinations = 0

    def ids(self, chosen: Sequence[int]) -> list[str]:
        return [*self.base, *(a for i in chosen for a in self.candidates[i].job.allocation_ids)]

    def fits(self, chosen: Sequence[int]) -> bool:
        return self.view.fits_after(self.request, self.ids(chosen))

    def plausible(self, chosen: Sequence[int]) -> bool:
        freed = self.base_freed
        for i in chosen:
            freed = freed + self.freed[i]
        picked = [self.candidates[i] for i in chosen]
        return self.view.could_fit(self.request, freed) and self.eligibility.allows(picked)

    def option(self, chosen: Sequence[int], exact: bool) -> NodeOption:
        victims = tuple(self.candidates[i] for i in chosen)
        cost = set_cost(self.eligibility.keys[v.job.job_id] for v in victims)
        return NodeOption(self.view.row, self.view.node_id, victims, cost, exact)

    def exact(self) -> NodeOption | None:
        for size in range(1, len(self.candidates) + 1):
            best: NodeOption | None = None
            for chosen in combinations(range(len(self.candidates)), size):
                self.combinations += 1
                if self.combinations > self.config.max_combinations_per_node:
                    raise _Budget
                if not self.plausible(chosen):
                    continue
                if self.view.fit_checks >= self.config.max_fit_checks_per_node:
                    raise _Budget
                if self.fits(chosen):
                    option = self.option(chosen, True)
                    best = option if best is None or option.rank < best.rank else best
            if best is not None:
                return best
        return None

    def greedy(self) -> NodeOption | None:
        chosen: list[int] = []
        for i in range(len(self.candidates)):
            if not self.eligibility.allows([self.candidates[j] for j in (*chosen, i)]):
                continue
            chosen.append(i)
            if self.fits(chosen):
                return self.option(prune(chosen, self.fits), False)
        return None


def prune(chosen: Sequence[int], fits: Callable[[Sequence[int]], bool]) -> list[int]:
    """Drop, costliest first, every element whose removal still fits: the result is minimal."""
    kept = list(chosen)
    for element in reversed(list(chosen)):
        trial = [e for e in kept if e != element]
        if fits(trial):
            kept = trial
    return kept


def search_node(view: NodeView, request: PodRequest, candidates: Sequence[CandidateFacts], base: tuple[str, ...],
                eligibility: Eligibility, config: SelectionConfig) -> NodeOption | None:  # fmt: skip
    """The cheapest victim set on ``view``'s node, or None when no allowed set makes room there.

    ``base``: allocations already being released (awaited jobs); ``candidates`` cheapest first.
    """
    search = _NodeSearch(view, request, candidates, base, eligibility, config)
    if search.fits([]):
        return NodeOption(view.row, view.node_id, (), set_cost(()), True)
    everything = list(range(len(candidates)))
    if not view.could_fit(request, search.base_freed + _sum(search.freed)) or not search.fits(everything):
        return None
    try:
        return search.exact()
    except _Budget:
        view.capped = True
        return search.greedy()


def _sum(footprints: Sequence[Footprint]) -> Footprint:
    total = Footprint()
    for item in footprints:
        total = total + item
    return total
