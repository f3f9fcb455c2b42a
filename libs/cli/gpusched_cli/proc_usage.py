"""CPU seconds and resident memory of a stack's processes, read from /proc (Linux), for the benchmarks.

A process is counted with all its descendants: PostgreSQL's backends are children of its postmaster, a
node agent's jobs of the agent. Nothing here stops or signals anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Usage:
    cpu_s: float  # user + system CPU seconds of the process and its descendants (those alive now)
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


def usage(pids: dict[str, int]) -> dict[str, Usage]:
    """Usage of each named process (0 when it is gone), children included in its CPU."""
    children: dict[int, list[tuple[int, float]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                children.setdefault(stat[0], []).append((int(entry), stat[1]))
    out = {}
    for name, pid in pids.items():
        own = _stat(pid)
        total, todo = (own[1] if own else 0.0), [pid] if own else []
        while todo:
            for child, cpu in children.get(todo.pop(), []):
                total += cpu
                todo.append(child)
        out[name] = Usage(total, _rss_mib(pid) if own else 0.0)
    return out


def postmaster_pid(data_dir: str | Path) -> int | None:
    """The pid of the PostgreSQL server of ``data_dir`` (its postmaster.pid), None when none runs."""
    try:
        return int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
