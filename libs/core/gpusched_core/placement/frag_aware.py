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

Where pods pin GPU models or are big enough to fit only a minority of the nodes, the FGD growth of
a request that could run on several kinds of node also pays for taking GPUs of nodes that the
constrained demand will need (``scarcity``: the pressure of the constrained shapes of the *whole*
workload on each node class; the typical shapes drop most of them, which are spread over many specs or
rare by count though large in GPUs). Without constrained shapes the pressure is 0 and nothing changes.

Memory, which FGD's measure and our capped one leave out, strands GPUs too: on openb's 8-GPU G2 nodes
(48 GiB of memory per GPU) the common one-GPU pods ask 47-49 GiB, and a node whose memory went to pods
that asked more per GPU keeps GPUs no pod can use. So the FGD growth also pays for the growth of the GPU
milli a node's free memory can no longer serve at the workload's own memory per GPU milli
(``WorkloadDistribution.memory_per_milli``: the memory its GPU requests ask over the GPU milli they ask),
``max(free milli - free memory / ratio, 0)`` after the pod minus before, weighted 2 (``memory_weight``).
A pod that asks memory in the workload's proportion on a node whose memory keeps pace with its GPUs pays
nothing; without a known ratio (the live default workload) nothing changes.

One configuration for every trace, no per-trace tuning. The typical shapes are the most popular ones that
cover 90% of the pods, not FGD's 95%: on the traces whose pods are a quarter CPU-only (cpu250) the rarer
shapes FGD's cut-off keeps (small shares, one-GPU pods of unusual CPU) tip most replays into spending
the GPU nodes' CPU early (about 1.2 points of unallocated GPU on every seed); elsewhere the two are within
a few tenths either way (see the README's sweep).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import kernel
from .fgd import FragmentationMemo, best_per_node, sigmoid_score
from .fragmentation import WorkloadDistribution
from .layout import ClusterLayout
from .model import GpuShare, MigSlice, PodRequest
from .policies import Candidates, NodeScores, mig_packing_scores
from .scarcity import _MAX_PRESSURE, NodeClasses, class_excess, class_pressure, gpus_asked
from .snapshot import ClusterSnapshot

# The secondary criterion moves a score by less than 0.1, so it only orders FGD's ties.
_SECONDARY_SCALE = 1e-6
_SECONDARY_CLIP = 1e5


@dataclass(eq=False)
class FragAwarePolicy:
    """FGD score first, then least CPU-capped fragmentation growth (in quarter-GPU steps), then node order.

    Speed: one memo keeps both growths per request shape and each node's best score and GPU, so a
    decision reads them, unless the scarcity cost is due (then they are scored from the growths).
    """

    workload: WorkloadDistribution
    name: str = "ours"
    popularity: float = 0.9
    secondary_step_milli: float = 250.0
    scarcity_weight: float = 2.0
    scarcity_slack: float = 0.8
    memory_weight: float = 2.0
    memo: FragmentationMemo = field(init=False)
    _pressure: tuple[ClusterLayout, np.ndarray | None, NodeClasses, list[float]] | None = field(init=False,
                                                                                            default=None)  # fmt: skip
    _class_free: tuple[NodeClasses, ClusterSnapshot, list[float]] | None = field(init=False, default=None)
    _derive: kernel.Derive = field(init=False)
    # the kernel's free GPU milli per class (int64), the snapshot it is as of; each request's classes it fits
    _class_free_kept: tuple[NodeClasses, ClusterSnapshot, np.ndarray] | None = field(init=False, default=None)
    _usable: dict[tuple[int, int, frozenset[str]], bytes] = field(init=False, default_factory=dict)
    _usable_of: NodeClasses | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        typical = self.workload.most_popular(self.popularity)
        self.memo = FragmentationMemo(typical, ("fgd", "capped"), derive=lambda growth: self._best(*growth))
        self._derive = kernel.Derive(True, self.secondary_step_milli, _SECONDARY_SCALE, _SECONDARY_CLIP)

    def pressure_for(self, layout: ClusterLayout) -> np.ndarray | None:
        """Pressure of constrained demand on each of the layout's node classes (None: none)."""
        if self._pressure is None or self._pressure[0] is not layout:
            classes = NodeClasses.of(layout)
            pressure = class_pressure(self.workload, classes) if self.scarcity_weight else None
            pressure = pressure if pressure is not None and pressure.any() else None
            self._pressure = (layout, pressure, classes, [] if pressure is None else pressure.tolist())
        return self._pressure[1]

    def score(self, candidates: Candidates) -> NodeScores:
        request, nodes = candidates.request, candidates.nodes
        if isinstance(request.gpu, MigSlice):
            return mig_packing_scores(candidates)
        entry = self.memo.refresh(candidates.snapshot, request, nodes)
        cost = self._scarcity(candidates.snapshot, request, nodes)
        memory = self._memory_cost(candidates.snapshot, request, nodes)
        if memory is not None:
            cost = memory if cost is None else cost + memory
        if cost is None:
            values, best_gpu = (derived[nodes] for derived in entry.derived)
        else:
            fgd, capped = (growth[nodes] for growth in entry.growth)
            values, best_gpu = self._best(fgd + (cost[:, None] if fgd.ndim == 2 else cost), capped)
        share = best_gpu if isinstance(request.gpu, GpuShare) else None
        return NodeScores(values, share, meaning=self.meaning)

    def _best(self, growth: np.ndarray, capped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each node's best score and GPU from its FGD growth (scarcity cost included) and capped growth."""
        if kernel.available():
            return kernel.best(growth, capped, self.secondary_step_milli, _SECONDARY_SCALE, _SECONDARY_CLIP)
        unfit = np.isinf(growth)  # where the capped growth is infinite too (the same fit decides both)
        # where unfit, the score is -inf whatever the secondary: no need to zero the infinite capped growth
        secondary = np.minimum(np.maximum(capped, -_SECONDARY_CLIP), _SECONDARY_CLIP)
        if self.secondary_step_milli > 0:
            secondary = np.floor(secondary / self.secondary_step_milli)
        per_gpu = sigmoid_score(growth) - _SECONDARY_SCALE * secondary
        return best_per_node(np.where(unfit, -np.inf, per_gpu))

    @property
    def meaning(self) -> str:
        """What a score is (a decision's reason says it)."""
        return "FGD score - 1e-6 x CPU-capped fragmentation growth (quarter GPUs)"

    def choose(self, snapshot: ClusterSnapshot, request: PodRequest, allowed: np.ndarray | None,
               salt: int | None) -> kernel.Choice | None:  # fmt: skip
        """The decision ``score`` and ``place`` would make, in one kernel call (``kernel.choose``): the
        same node, GPU, score, ties and count of feasible nodes. Only where ``kernel.available()`` and the
        request is not a MIG slice (``place`` asks ``fast``)."""
        ratio = self.workload.memory_per_milli
        memory = ratio if self.memory_weight and ratio is not None and request.memory_mib else 0.0
        scarcity = None
        if self.pressure_for(snapshot.layout) is not None:
            scarcity = lambda at: self._scarcity_inputs(at, snapshot, request)  # noqa: E731
        try:
            return self.memo.choose(snapshot, request, allowed, salt, self._derive, memory, self.memory_weight,
                                    scarcity)  # fmt: skip
        except BaseException:
            self._class_free_kept = None  # the call may have failed before stepping the sums: work them out again
            raise

    def _scarcity_inputs(self, at: ClusterSnapshot, snapshot: ClusterSnapshot, request: PodRequest) -> tuple[object, ...]:
        """What the kernel computes each class's scarcity cost from (``class_excess`` and ``_class_cost`` in
        C): the pressure, the GPUs and free GPU milli of each class (int64, as of ``at``, where the memo's node
        state steps from: the kernel moves it to ``snapshot``), the classes the request fits, node classes."""
        _, pressure, classes, _ = self._pressure  # type: ignore[misc]
        kept = self._class_free_kept
        if kept is None or kept[0] is not classes or kept[1] is not at:
            free = np.bincount(classes.node_class, weights=at.share_free_total, minlength=pressure.size)
            kept = (classes, at, free.astype(np.int64))
        self._class_free_kept = (classes, snapshot, kept[2])  # where the call leaves it
        key = (request.cpu_milli, gpus_asked(request), request.allowed_models)
        usable = self._usable.get(key) if self._usable_of is classes else None
        if usable is None:
            if self._usable_of is not classes:
                self._usable, self._usable_of = {}, classes
            usable = self._usable[key] = bytes(classes.fits(*key))
        return (pressure, classes.count, kept[2], usable, classes.node_class, self.scarcity_slack,
                self.scarcity_weight, _MAX_PRESSURE)  # fmt: skip

    def fast(self, request: PodRequest) -> bool:
        """Whether ``choose`` may decide ``request``."""
        return kernel.available() and not isinstance(request.gpu, MigSlice)

    def _scarcity(self, snapshot: ClusterSnapshot, request: PodRequest, nodes: np.ndarray) -> np.ndarray | None:
        """(len(nodes),) ``scarcity_cost`` weighted (every GPU of a node alike), or None where it is 0
        for every node."""
        cost = self._class_cost(snapshot, request)
        if cost is None:
            return None
        return cost[self._pressure[2].node_class[nodes]]  # type: ignore[index]

    def _class_cost(self, snapshot: ClusterSnapshot, request: PodRequest) -> np.ndarray | None:
        """(K + 1,) the weighted scarcity cost of a node of each class, or None where it is 0 for every
        class (see ``_scarcity``)."""
        if self.pressure_for(snapshot.layout) is None:
            return None
        _, pressure, classes, pressure_list = self._pressure  # type: ignore[misc]
        free = self._free_per_class(snapshot, classes, pressure.size)  # in step on every decision
        milli = request.gpu_milli_total
        if milli == 0:
            return None
        per_class = class_excess(pressure_list, classes, free, request, self.scarcity_slack)
        if per_class is None or not any(per_class):
            return None
        weight = self.scarcity_weight  # the same operations, in the same order, as numpy's on the array
        return np.array([weight * (min(x, _MAX_PRESSURE) * milli) for x in per_class])

    def _memory_cost(self, snapshot: ClusterSnapshot, request: PodRequest, nodes: np.ndarray) -> np.ndarray | None:
        """(len(nodes),) weighted growth of the GPU milli each node's free memory can no longer serve at
        the workload's memory per GPU milli, or None where it does not grow on any node."""
        ratio = self.workload.memory_per_milli
        if not self.memory_weight or ratio is None or request.memory_mib == 0:
            return None
        if kernel.available():
            return kernel.memory_cost(snapshot, nodes, ratio, request, self.memory_weight)
        gpu = snapshot.share_free_total[nodes].astype(np.float64)
        memory = snapshot.memory_free[nodes] / ratio
        before = np.maximum(gpu - memory, 0.0)
        after = np.maximum(gpu - request.gpu_milli_total - (memory - request.memory_mib / ratio), 0.0)
        growth = after - before
        if not growth.any():
            return None
        return self.memory_weight * growth

    def _free_per_class(self, snapshot: ClusterSnapshot, classes: NodeClasses, size: int) -> list[float]:
        """(K) free share-usable GPU milli per class. A decision changes a node or two: the last sums
        move by what the memo's rows saw change since the snapshot they were taken on (whole milli:
        the float sums are exact either way), instead of a sum over every node per decision."""
        kept = self._class_free
        if kept is not None and kept[0] is classes and kept[1] is snapshot:
            return kept[2]
        previous, rows = self.memo.rows.last_change
        in_step = kept is not None and kept[0] is classes and self.memo.rows.snapshot is snapshot
        if in_step and previous is not None and rows is not None and kept[1] is previous:  # type: ignore[index]
            free = kept[2].copy()  # type: ignore[index]
            now, before, node_class = snapshot.share_free_total, previous.share_free_total, classes.node_class
            for row in rows.tolist():  # a node or two: plain adds cost less than a bincount
                free[node_class[row]] += float(now[row] - before[row])
        else:
            free = np.bincount(classes.node_class, weights=snapshot.share_free_total, minlength=size).tolist()
        self._class_free = (classes, snapshot, free)
        return free

