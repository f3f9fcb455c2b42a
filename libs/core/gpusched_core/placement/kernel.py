"""The placement engine's C kernel (``_kernel.c``), when it is built: a memoised policy's decision in one call.

Why: a decision under ``fgd`` or ``ours`` recomputes the growth of the few nodes that changed since the
shape asked was last weighed, and the statistics of the node the last decision took. In numpy that is
some 60 array calls on a few rows, each a microsecond or two of call overhead whatever the rows, besides
the passes over every node (feasibility, costs, the best): about 300 us a decision at 1,000 nodes.
``choose`` does all of it node by node in one call; ``stats`` and ``step`` keep ``RowState`` in step;
``growth``, ``best`` and ``memory_cost`` serve the numpy-shaped path (``score``) where it still runs. Each
computes what ``growth.py`` and the policies compute, with the same formulas and the same rounding
(tested equal, and against the plain reference, in the placement engine's unit tests).

The extension is built by ``pip install`` (``setup.py``, optional: without a C compiler the install still
succeeds and numpy does the work). The placement service's ``GPUSCHED_PLACEMENT_KERNEL=numpy`` turns it
off (``use``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import tiebreak
from .model import GpuShare, PodRequest, WholeGpus
from .policies import MAX_NODE_SCORE

if TYPE_CHECKING:
    from .frag_memo import FragmentationMemo
    from .growth import GrowthTables
    from .snapshot import ClusterSnapshot

try:  # built by setup.py; absent where no C compiler was found at install time
    from . import _kernel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _kernel = None

# stale nodes in one decision from which nodes alike are computed once (``choose``)
DEDUPE_FROM = 64

# whether decisions use the kernel: wherever it is built, unless a process turns it off (``use``)
ENABLED = _kernel is not None


def built() -> bool:
    """Whether the C kernel was built at install."""
    return _kernel is not None


def available() -> bool:
    """Whether decisions use the C kernel (built, and not turned off)."""
    return ENABLED


def supports(tables: GrowthTables) -> bool:
    """Whether the kernel takes ``tables``: at most ``_kernel.MAX_GPUS`` (64) GPUs a node and ``MAX_GROUPS``
    (256) GPU groups in the typical workload (numpy decides beyond). Kept on the tables (asked per decision)."""
    kept = tables._class_tables.get(("kernel-supports",))
    if kept is None:
        fits = tables.layout.max_gpus <= _kernel.MAX_GPUS and tables.group_milli.size <= _kernel.MAX_GROUPS
        kept = tables._class_tables[("kernel-supports",)] = (fits,)  # type: ignore[assignment]
    return kept[0]  # type: ignore[return-value]


# what ``choose`` answers where the kernel does not take the tables: the caller decides with numpy
UNSUPPORTED = object()


def use(enabled: bool) -> bool:
    """Turn the kernel on (where built) or off for this process; returns whether decisions now use it.
    Decisions are the same either way (only their speed differs); a policy's memo is best started after."""
    global ENABLED
    ENABLED = enabled and _kernel is not None
    return ENABLED


def _i64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


def _free(snapshot: ClusterSnapshot) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The snapshot's free GPU milli (int32), share-usable milli per node and free CPU, C-contiguous."""
    return (np.ascontiguousarray(snapshot.share_free, dtype=np.int32), _i64(snapshot.share_free_total),
            _i64(snapshot.cpu_free))  # fmt: skip


def tables_for(tables: GrowthTables, measures: tuple[str, ...]) -> Any:
    """The kernel's copy of ``tables`` under ``measures`` (kept on the tables: built once)."""
    key = ("kernel", measures)
    kept = tables._class_tables.get(key)
    if kept is None:
        breaks, fits, cap = tables.cpu_class_tables(measures)
        shapes = tables.shapes
        kept = _kernel.tables(
            tables.layout.max_gpus, tables.group_milli.size, shapes.weight.size, breaks.size + 1,
            tables.group_ok.shape[0], _i64(tables.group_milli), np.ascontiguousarray(tables.group_ok, dtype=np.uint8),
            _i64(breaks), _i64(tables.shape_group), _i64(shapes.count), np.ascontiguousarray(shapes.weight, np.float64),
            np.ascontiguousarray(fits, dtype=np.uint8), _i64(cap))  # fmt: skip
        tables._class_tables[key] = kept
    return kept


def gpu_models(tables: GrowthTables) -> np.ndarray:
    """(nodes, gpus) int64 model ids (kept on the tables)."""
    kept = tables._class_tables.get(("kernel-models",))
    if kept is None:
        kept = tables._class_tables[("kernel-models",)] = _i64(tables.gpu_model)
    return kept


def stats(tables: GrowthTables, measures: tuple[str, ...], snapshot: ClusterSnapshot, rows: np.ndarray,
          count: np.ndarray, usable: np.ndarray, before: dict[str, np.ndarray], cpu_class: np.ndarray) -> None:  # fmt: skip
    """Write ``rows``' group figures into ``count``/``usable``, their fragmentation per measure into
    ``before`` and their free CPU class into ``cpu_class`` (what ``RowState`` keeps per node)."""
    share_free, total, cpu = _free(snapshot)
    _kernel.stats(tables_for(tables, measures), share_free, gpu_models(tables), total, cpu, _i64(rows), count, usable,
                  before.get("fgd"), before.get("capped"), cpu_class)  # fmt: skip


def step_inputs(tables: GrowthTables, old: ClusterSnapshot, new: ClusterSnapshot, memory: bool,
                among: np.ndarray | None, version: np.ndarray, clock: int, count: np.ndarray, usable: np.ndarray,
                before: dict[str, np.ndarray], cpu_class: np.ndarray, out: np.ndarray | None,
                class_free: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[object, ...]:  # fmt: skip
    """What ``step`` (and ``choose``, which steps first when given them) takes: the two snapshots, the nodes to
    compare (all when ``among`` is None), ``RowState``'s arrays to update, and ``class_free`` (node classes, free
    GPU milli per class) when a sum per class is kept in step too."""
    node_class, free = (None, None) if class_free is None else class_free
    return (old.share_free, new.share_free, old.cpu_free, new.cpu_free, old.gpu_memory_free if memory else None,
            new.gpu_memory_free if memory else None, among, gpu_models(tables), new.share_free_total, version, clock,
            count, usable, before.get("fgd"), before.get("capped"), cpu_class, out,
            None if class_free is None else old.share_free_total, node_class, free)  # fmt: skip


def step(tables: GrowthTables, measures: tuple[str, ...], old: ClusterSnapshot, new: ClusterSnapshot, memory: bool,
         among: np.ndarray | None, version: np.ndarray, clock: int, count: np.ndarray, usable: np.ndarray,
         before: dict[str, np.ndarray], cpu_class: np.ndarray) -> np.ndarray:  # fmt: skip
    """The nodes that changed between two snapshots, and ``stats`` on them, in one call: returns those nodes, now at
    version ``clock`` with their statistics again (``RowState.sync``)."""
    out = np.empty(new.layout.node_count if among is None else among.size, dtype=np.int64)
    k = _kernel.step(tables_for(tables, measures), step_inputs(tables, old, new, memory, among, version, clock,
                                                               count, usable, before, cpu_class, out))  # fmt: skip
    return out[:k]


def _request(request: PodRequest) -> tuple[int, int, int, int]:
    """(kind, milli of a share, whole GPUs, GPU memory of a share) as the kernel takes them."""
    gpu = request.gpu
    if isinstance(gpu, GpuShare):
        return 2, gpu.milli, 0, gpu.memory_mib
    if isinstance(gpu, WholeGpus):
        return 1, 0, gpu.count, 0
    return 0, 0, 0, 0


def _growth_inputs(tables: GrowthTables, snapshot: ClusterSnapshot, request: PodRequest, count: np.ndarray,
                   usable: np.ndarray, before: dict[str, np.ndarray]) -> tuple[object, ...]:  # fmt: skip
    kind, _, _, memory = _request(request)
    allowed = tables.layout.model_mask(request.allowed_models) if request.allowed_models and kind else None
    share_free, total, cpu = _free(snapshot)
    memory_free = _i64(snapshot.gpu_memory_free) if memory else None
    return (share_free, gpu_models(tables), allowed, memory_free, total, cpu, count, usable, before.get("fgd"),
            before.get("capped"))  # fmt: skip


def growth(tables: GrowthTables, snapshot: ClusterSnapshot, request: PodRequest, rows: np.ndarray,
           count: np.ndarray, usable: np.ndarray, before: dict[str, np.ndarray],
           measures: tuple[str, ...]) -> tuple[np.ndarray, ...]:  # fmt: skip
    """``growth.growth_rows`` for ``rows``, from the whole cluster's kept figures (``RowState``)."""
    kind, milli, gpu_count, memory = _request(request)
    shape = (rows.size, tables.layout.max_gpus) if kind == 2 else (rows.size,)
    out = {measure: np.empty(shape) for measure in measures}
    _kernel.growth(tables_for(tables, measures), kind, milli, gpu_count, request.cpu_milli, memory,
                   *_growth_inputs(tables, snapshot, request, count, usable, before), _i64(rows), out.get("fgd"),
                   out.get("capped"))  # fmt: skip
    return tuple(out[measure] for measure in measures)


@dataclass(frozen=True, slots=True)
class Derive:
    """How a node's best score comes from its growth: ``trunc(max_score / (1 + exp(growth / 1000)))``, less
    ``scale * floor(clip(capped growth) / step)`` when ``secondary`` (``FragAwarePolicy``; FGD has none)."""

    secondary: bool
    step: float = 0.0
    scale: float = 0.0
    clip: float = 0.0


@dataclass(frozen=True, slots=True)
class Choice:
    """One decision's outcome (``choose``): the best node and GPU, its score, how many nodes passed every
    check and how many tie for the best, and how many nodes' state it brought up to the snapshot."""

    row: int  # -1 where no node passes (``feasible`` 0)
    share_gpu: int | None
    value: float
    feasible: int
    ties: int
    changed: int = 0  # nodes whose state the call stepped (see ``choose``'s ``step``)


def _scratch(memo: FragmentationMemo, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``choose``'s per-node scores, GPUs and tied rows for ``count`` nodes, kept on the memo: written and read
    within one call, and a memo (as the policy it belongs to) serves one decision at a time."""
    arrays = memo.scratch.get(count)
    if arrays is None:
        memo.scratch.clear()
        arrays = memo.scratch[count] = (np.empty(count), np.empty(count, dtype=np.int64),
                                        np.empty(count, dtype=np.int64))  # fmt: skip
    return arrays


def choose(memo: FragmentationMemo, tables: GrowthTables, snapshot: ClusterSnapshot, request: PodRequest,
           extra: np.ndarray | None, derive: Derive, scarcity: tuple[object, ...] | None, memory_ratio: float,
           memory_weight: float, salt: int | None, step: tuple[object, ...] | None = None) -> Choice | None:  # fmt: skip
    """A memoised policy's decision in one kernel call (None: no node passes; ``UNSUPPORTED`` where the
    kernel does not take the tables, see ``supports``). ``tables`` is what ``memo.rows`` keeps; ``step``: the
    inputs of ``step`` (``step_inputs``) where the memo's node state is to be brought up to ``snapshot`` first
    (``RowState.begin``; the caller ends it with the count ``Choice.changed``); ``extra``: nodes allowed besides
    the checks (a selector, a gang's domain); ``scarcity``: what ``FragAwarePolicy`` computes each class's
    scarcity cost from (``_scarcity_inputs``), None for none; ``memory_ratio`` 0 for no memory cost; ties go to
    node order, or to the smallest seeded hash under ``salt``.

    Every decision passes here: the snapshot's arrays go to the kernel as they are (their dtypes are fixed
    where snapshots are made; the kernel checks each array's size and raises on a mismatch)."""
    if not supports(tables):
        return UNSUPPORTED  # type: ignore[return-value]
    memo_part = _memo_part(memo, tables, derive)
    entry = memo.entry(tables, request)
    entry_part = entry.kernel_args
    if entry_part is None:  # once per shape: what its requests all ask, and its memo's arrays
        kind, milli, gpu_count, memory = _request(request)
        growth, measures = entry.growth, memo.measures
        allowed = tables.layout.model_mask(request.allowed_models) if request.allowed_models and kind else None
        entry_part = entry.kernel_args = (
            kind, milli, gpu_count, request.cpu_milli, memory, request.gpu_milli_total, allowed, entry.version,
            growth[measures.index("fgd")], growth[measures.index("capped")] if "capped" in measures else None,
            *entry.derived)  # fmt: skip
    snapshot_part = (snapshot.share_free, snapshot.share_free_total, snapshot.cpu_free, snapshot.memory_free,
                     snapshot.full_free_count, snapshot.max_share_free)  # fmt: skip
    call_part = (request.memory_mib, snapshot.gpu_memory_free if entry_part[4] else None, extra, scarcity, step,
                 memory_ratio, memory_weight, salt is not None)  # fmt: skip
    passed, row, gpu, value, ties, changed = _kernel.choose(memo_part, entry_part, snapshot_part, call_part)
    if passed == 0:
        return Choice(-1, None, 0.0, 0, 0, changed)
    if salt is not None and ties > 1:
        candidates = memo_part[9][:ties]  # the tied rows
        row = int(candidates[np.argmin(tiebreak.keys(candidates, salt))])
        gpu = int(memo_part[8][row])  # its GPU
    return Choice(row, gpu if entry_part[0] == 2 else None, value, passed, ties, changed)


def _memo_part(memo: FragmentationMemo, tables: GrowthTables, derive: Derive) -> tuple[object, ...]:
    """``choose``'s arguments that stay while the memo's node state keeps its arrays (kept on the memo)."""
    rows = memo.rows
    kept = memo.kernel_args
    if kept is not None and kept[0] is tables and kept[1] is rows.version and kept[2] is derive and \
            kept[3] == DEDUPE_FROM:  # fmt: skip
        return kept[4]  # type: ignore[no-any-return]
    scores, gpus, tied = _scratch(memo, tables.layout.node_count)
    before = rows.before
    part = (tables_for(tables, memo.measures), gpu_models(tables), rows.count, rows.usable, before.get("fgd"),
            before.get("capped"), rows.version, scores, gpus, tied, _MAX_SCORE, derive.step, derive.scale, derive.clip,
            derive.secondary, DEDUPE_FROM)  # fmt: skip
    memo.kernel_args = (tables, rows.version, derive, DEDUPE_FROM, part)
    return part


_MAX_SCORE = float(MAX_NODE_SCORE)


def best(growth: np.ndarray, capped: np.ndarray | None, step: float, scale: float,
         clip: float) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Each row's best score and first GPU among equals of the per-GPU score ``trunc(100 / (1 + exp(growth /
    1000))) - scale * floor(clip(capped) / step)`` (-inf where the growth is infinite): ``fgd.best_per_node``
    of ``FragAwarePolicy._best``'s (``capped`` given) or of ``fgd.fgd_scores`` (None)."""
    rows = growth.shape[0]
    width = growth.shape[1] if growth.ndim == 2 else 1
    values, gpu = np.empty(rows), np.empty(rows, dtype=np.int64)
    _kernel.best(rows, width, np.ascontiguousarray(growth, dtype=np.float64),
                 None if capped is None else np.ascontiguousarray(capped, dtype=np.float64),
                 float(MAX_NODE_SCORE), step, scale, clip, values, gpu)  # fmt: skip
    return values, gpu  # a row of one value: GPU 0


def memory_cost(snapshot: ClusterSnapshot, nodes: np.ndarray, ratio: float, request: PodRequest,
                weight: float) -> np.ndarray | None:  # fmt: skip
    """``FragAwarePolicy._memory_cost`` on ``nodes``: (len(nodes),) or None where it is 0 on every node."""
    out = np.empty(nodes.size)
    if _kernel.memory_cost(_i64(snapshot.share_free_total), _i64(snapshot.memory_free), _i64(nodes), ratio,
                           request.gpu_milli_total, request.memory_mib, weight, out):  # fmt: skip
        return out
    return None
