"""Victims for a gang preemptor: ``node_count`` distinct nodes, each able to host one member.

Each node's cheapest option for one member (no victims where a member fits already); the best
``node_count`` nodes by (victim count, cost, node order); the union of their victims (a victim gang
that spans several chosen nodes counts once). ``select`` verifies the union with ``place_gang`` and
prunes it. The result is exact when every node option was exact and no candidate spans nodes
(then the victims of distinct nodes are disjoint and the sum of per-node minimums is the minimum).
"""

from __future__ import annotations

import numpy as np

from gpusched_core.placement import ClusterSnapshot, GangRequest, feasible_mask

from .eligibility import Eligibility
from .model import SelectionConfig
from .nodeview import NodeView, allocations_by_node, released
from .ordering import CandidateFacts, set_cost
from .search import NodeOption, search_node


def _candidates_by_row(snapshot: ClusterSnapshot,
                       eligibility: Eligibility) -> tuple[dict[int, list[CandidateFacts]], bool]:  # fmt: skip
    """Candidates per node row, and whether any candidate spans more than one node."""
    by_row: dict[int, list[CandidateFacts]] = {}
    spans = False
    for facts in eligibility.candidates:
        bindings = [b for a in facts.job.allocation_ids for b in snapshot.allocations[a]]  # type: ignore[index]
        rows = {snapshot.node_index(b.node_id) for b in bindings}
        spans |= len(rows) > 1
        for row in rows:
            by_row.setdefault(row, []).append(facts)
    return by_row, spans


def gang_options(snapshot: ClusterSnapshot, gang: GangRequest, eligibility: Eligibility, config: SelectionConfig,
                 awaited: tuple[str, ...]) -> tuple[tuple[CandidateFacts, ...], bool, int] | None:  # fmt: skip
    """(victims, exact, options considered) for the best ``gang.node_count`` nodes, or None."""
    member = gang.member(0)
    base_snapshot = released(snapshot, awaited)
    ready = np.flatnonzero(feasible_mask(base_snapshot, member)).tolist()
    options = {row: NodeOption(row, snapshot.nodes[row].id, (), set_cost(()), True) for row in ready}
    by_row, unproven = _candidates_by_row(snapshot, eligibility)
    by_node = allocations_by_node(snapshot)
    awaited_set = set(awaited)
    for row in sorted(set(by_row) - set(options)):
        allocations = by_node.get(snapshot.nodes[row].id, {})
        base = tuple(a for a in sorted(allocations) if a in awaited_set)
        movable = [*base, *(a for facts in by_row[row] for a in facts.job.allocation_ids)]
        view = NodeView(snapshot, row, allocations, movable)
        option = search_node(view, member, by_row[row], base, eligibility, config)
        unproven |= view.capped  # a capped node's option is not proven minimal
        if option is not None:
            options[row] = option
    if len(options) < gang.node_count:
        return None
    best = sorted(options.values(), key=lambda o: o.rank)[: gang.node_count]
    victims: dict[str, CandidateFacts] = {}
    for option in best:
        for facts in option.victims:
            victims.setdefault(facts.job.job_id, facts)
    if not eligibility.allows(victims.values()):
        return None
    exact = all(option.exact for option in best) and not unproven
    return tuple(victims.values()), exact, len(options)
