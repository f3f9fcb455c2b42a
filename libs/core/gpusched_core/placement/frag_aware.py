"""``ours``: FGD's score, with ties settled by fragmentation that also counts CPU (beats FGD on openb).

Why: at high load most unplaced GPU on the openb traces sits on nodes whose CPU ran out while
GPUs were still free. FGD counts a node as usable for a request shape as soon as *one* such request
fits, so it does not see that spending CPU on a node with many free GPUs strands them. Our
``capped`` measure lets a shape use at most the GPU of as many requests as the node's free CPU
admits. Used on its own it loses some of FGD's strengths (its truncated score makes many nodes tie,
and ties fall to node order, which packs); so we keep FGD's truncated score as the first criterion
and use the capped growth only to order the nodes FGD considers equal, then node order. The capped
growth counts in steps of a quarter GPU: finer differences would prefer fresh nodes over used ones
and spread small requests early (big multi-GPU requests then fail long before the cluster is full).

Where pods pin GPU models, the FGD growth of a request that could run on several models also pays
for taking GPUs of models that the pinned demand will need (``scarcity``: the pressure of the pinned
shapes of the *whole* workload on each model; the typical 95% drops most pinned shapes, which are
spread over many specs). Without pinned shapes the pressure is 0 and nothing changes.

One configuration for every trace: FGD's typical shapes (95% most popular), no per-trace tuning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fgd import FragmentationMemo, sigmoid_score
from .fragmentation import WorkloadDistribution
from .model import GpuShare, MigSlice
from .layout import ClusterLayout
from .policies import Candidates, NodeScores, mig_packing_scores
from .scarcity import ModelIndex, model_pressure, scarcity_cost

# The secondary criterion moves a score by less than 0.1, so it only orders FGD's ties.
_SECONDARY_SCALE = 1e-6
_SECONDARY_CLIP = 1e5


@dataclass(eq=False)
class FragAwarePolicy:
    """FGD score first, then least CPU-capped fragmentation growth (in quarter-GPU steps), then node order."""

    workload: WorkloadDistribution
    name: str = "ours"
    popularity: float = 0.95
    secondary_step_milli: float = 250.0
    scarcity_weight: float = 2.0
    fgd_memo: FragmentationMemo = field(init=False)
    capped_memo: FragmentationMemo = field(init=False)
    _pressure: tuple[ClusterLayout, np.ndarray | None, ModelIndex] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        typical = self.workload.most_popular(self.popularity)
        self.fgd_memo = FragmentationMemo(typical, measure="fgd")
        self.capped_memo = FragmentationMemo(typical, measure="capped")

    def pressure_for(self, layout: ClusterLayout) -> np.ndarray | None:
        """Pressure of pinned demand on each of the layout's models (None: none pinned)."""
        if self._pressure is None or self._pressure[0] is not layout:
            pressure = model_pressure(self.workload, layout) if self.scarcity_weight else None
            self._pressure = (layout, pressure if pressure is not None and pressure.any() else None,
                              ModelIndex.of(layout))  # fmt: skip
        return self._pressure[1]

    def score(self, candidates: Candidates) -> NodeScores:
        request = candidates.request
        if isinstance(request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        growth = self.fgd_memo.growth(candidates.snapshot, request)[candidates.nodes]
        pressure = self.pressure_for(candidates.snapshot.layout)
        if pressure is not None:
            index = self._pressure[2]  # type: ignore[index]
            cost = scarcity_cost(pressure, index, candidates.snapshot, request, candidates.nodes,
                                 per_gpu=isinstance(request.gpu, GpuShare))  # fmt: skip
            growth = growth + self.scarcity_weight * cost
        capped = self.capped_memo.growth(candidates.snapshot, request)[candidates.nodes]
        secondary = np.clip(np.where(np.isinf(capped), 0.0, capped), -_SECONDARY_CLIP, _SECONDARY_CLIP)
        if self.secondary_step_milli > 0:
            secondary = np.floor(secondary / self.secondary_step_milli)
        per_gpu = sigmoid_score(growth) - _SECONDARY_SCALE * secondary
        per_gpu = np.where(np.isinf(growth), -np.inf, per_gpu)
        best_gpu = per_gpu.argmax(axis=1)
        values = per_gpu[np.arange(best_gpu.size), best_gpu]
        share = best_gpu if isinstance(request.gpu, GpuShare) else None
        return NodeScores(values, share, meaning="FGD score - 1e-6 x CPU-capped fragmentation growth (quarter GPUs)")
