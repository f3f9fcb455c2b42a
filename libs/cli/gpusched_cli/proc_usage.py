"""CPU seconds and resident memory of a stack's processes, read from /proc (Linux), for the benchmarks.

PostgreSQL is counted with its backends (children of its postmaster); a process's children are read from /proc/<pid>/task/*/children, never by scanning all of /proc (a cluster of
simulated nodes runs tens of thousands of jobs). Nothing here stops or signals anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Usage:
    cpu_s: float  # user + system CPU seconds of the process (and the children counted with it, alive now)
    rss_mib: float  # resident memory of the process itself


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, own CPU seconds) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _HZ


def _rss_mib(pid: int) -> float:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * _PAGE / 2**20


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux's /proc/<pid>/task/<tid>/children), without scanning /proc."""
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def usage(pids: dict[str, int], trees: frozenset[str] = frozenset()) -> dict[str, Usage]:
    """Usage of each named process (0 when it is gone); those named in ``trees`` count all their
    descendants (PostgreSQL's backends)."""
    out = {}
    for name, pid in pids.items():
        own = _stat(pid)
        if own is None:
            out[name] = Usage(0.0, 0.0)
            continue
        total = own[1]
        if name in trees:
            todo = _children(pid)
            while todo:
                child = todo.pop()
                stat = _stat(child)
                if stat is not None:
                    total += stat[1]
                    todo += _children(child)
        out[name] = Usage(total, _rss_mib(pid))
    return out


def postmaster_pid(data_dir: str | Path) -> int | None:
    """The pid of the PostgreSQL server of ``data_dir`` (its postmaster.pid), None when none runs."""
    try:
        return int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None


def machine_cpu_s(stat: str | None = None) -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (``/proc/stat``'s first line:
    idle and iowait are not busy): what every process and the kernel used, counted or not by ``usage``."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    fields = [int(v) for v in text.splitlines()[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(fields)
    return (total - fields[3] - fields[4]) / _HZ, total / _HZ


def busy_cores(before: tuple[float, float], after: tuple[float, float], cores: int) -> float:
    """The cores the machine had busy between two ``machine_cpu_s`` readings."""
    total = after[1] - before[1]
    return cores * (after[0] - before[0]) / total if total > 0 else 0.0
