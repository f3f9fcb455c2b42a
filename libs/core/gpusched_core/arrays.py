"""Job arrays (pure): ``--array 0-99%8`` read into task indices and a cap, one JobSpec per task (job id
``<array_id>.<index>``), what a task learns of its array, and which waiting tasks the cap holds back.

The syntax is Slurm's: comma-separated indices and ranges, a range may step (``0-20:5``), and ``%K``
caps how many tasks hold GPUs at once. Quota applies the cap: a task beyond it is not offered to the
reservation cycle (it waits with the cap as its reason) until a running task of its array ends."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpusched_common import events as ev

MAX_ARRAY_TASKS = 10_000  # tasks one submission may create
MAX_ARRAY_INDEX = 1_000_000
_ITEM = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class ArrayError(ValueError):
    """An array expression that cannot be read, or names too many tasks; the message says why."""


@dataclass(frozen=True)
class ArrayRequest:
    indices: tuple[int, ...]  # ascending, distinct
    max_running: int | None = None

    def describe(self) -> str:
        cap = f"%{self.max_running}" if self.max_running is not None else ""
        return compact(self.indices) + cap


def parse_array(text: str) -> ArrayRequest:
    """``0-99``, ``1,3,5-7``, ``0-20:5``, each with an optional ``%K``; ArrayError with the reason."""
    text = text.strip()
    body, _, cap_text = text.partition("%")
    max_running = None
    if cap_text:
        if not cap_text.isdigit() or int(cap_text) < 1:
            raise ArrayError(f"array {text!r}: the cap after % must be a whole number of at least 1")
        max_running = int(cap_text)
    indices: set[int] = set()
    for item in body.split(","):
        match = _ITEM.match(item.strip())
        if match is None:
            raise ArrayError(f"array {text!r}: {item.strip()!r} is not an index, a range A-B or a range A-B:STEP")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise ArrayError(f"array {text!r}: range {item.strip()!r} runs backwards or has a step under 1")
        if last > MAX_ARRAY_INDEX:
            raise ArrayError(f"array {text!r}: indices go up to {MAX_ARRAY_INDEX}")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ArrayError(f"array {text!r} has more than {MAX_ARRAY_TASKS} tasks")
        indices.update(range(first, last + 1, step))
    return ArrayRequest(tuple(sorted(indices)), max_running)


def compact(indices: Iterable[int]) -> str:
    """Ascending indices as ranges: (0, 1, 2, 5) -> ``0-2,5``."""
    parts: list[str] = []
    run: list[int] = []
    for index in sorted(indices):
        if run and index == run[-1] + 1:
            run.append(index)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [index]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ",".join(parts)


def task_id(array_id: str, index: int) -> str:
    return f"{array_id}.{index}"


def task_specs(spec: ev.JobSpec, array_id: str, request: ArrayRequest) -> list[tuple[str, ev.JobSpec]]:
    """(job id, spec) of every task, in index order; each spec names its task."""
    size = len(request.indices)
    return [(task_id(array_id, i), spec.model_copy(update={"array": ev.ArrayTask(
        array_id=array_id, index=i, size=size, max_running=request.max_running)})) for i in request.indices]


def check_task(job_id: str, task: ev.ArrayTask) -> list[str]:
    """Every reason a task's description does not hold together (admission and the gateway check it)."""
    reasons = []
    if "." in task.array_id or not task.array_id:
        reasons.append(f"array id {task.array_id!r} must not be empty or contain '.'")
    if not 0 <= task.index <= MAX_ARRAY_INDEX:
        reasons.append(f"array index {task.index} is outside 0..{MAX_ARRAY_INDEX}")
    if not 1 <= task.size <= MAX_ARRAY_TASKS:
        reasons.append(f"array size {task.size} is outside 1..{MAX_ARRAY_TASKS}")
    if task.max_running is not None and task.max_running < 1:
        reasons.append(f"array cap {task.max_running} must be at least 1")
    if job_id != task_id(task.array_id, task.index):
        reasons.append(f"a task of array {task.array_id} with index {task.index} is job "
                       f"{task_id(task.array_id, task.index)}, not {job_id}")
    return reasons


def array_env(task: ev.ArrayTask | None) -> dict[str, str]:
    """What a task learns of its array (Slurm's SLURM_ARRAY_* under our names)."""
    if task is None:
        return {}
    return {"GPUSCHED_ARRAY_JOB_ID": task.array_id, "GPUSCHED_ARRAY_INDEX": str(task.index),
            "GPUSCHED_ARRAY_TASK_COUNT": str(task.size)}


@dataclass(frozen=True)
class WaitingTask:
    job_id: str
    array_id: str
    index: int
    max_running: int


def cap_reason(array_id: str, max_running: int) -> str:
    return f"array {array_id} runs at most {max_running} tasks at once"


def held_back(waiting: Iterable[WaitingTask], active: Mapping[str, int]) -> dict[str, str]:
    """The waiting tasks the cap keeps out of this cycle, with the reason: per array, the lowest indices
    fill the free places (``max_running`` minus the tasks that hold quota already), the rest wait."""
    by_array: dict[str, list[WaitingTask]] = {}
    for task in waiting:
        by_array.setdefault(task.array_id, []).append(task)
    out: dict[str, str] = {}
    for array_id, tasks in by_array.items():
        tasks.sort(key=lambda t: t.index)
        cap = min(t.max_running for t in tasks)
        free = max(0, cap - active.get(array_id, 0))
        for task in tasks[free:]:
            out[task.job_id] = cap_reason(array_id, cap)
    return out
