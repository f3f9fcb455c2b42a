"""The node agent's on-disk job records: a contract between the agent, which writes them, and whoever
must find its jobs without it.

Writer: the node agent's `JobRunner` (services/node_agent/runner.py). For every job it starts it writes
`<work dir>/<job>.json`, a `JobRecord` as a JSON object, before the job's start is reported; the work
dir is one per node, `GPUSCHED_AGENT_WORK_DIR/<node id>`. Each job runs under a wrapper that leads its own
session, so the wrapper's pid is also the job's process group id.

Readers: the agent itself when it restarts (it adopts the jobs that still run), and `gpusched down`
(libs/cli/gpusched_cli/teardown.py), which, with the agents stopped, stops every recorded job that still
runs by its process group (`stop_job_groups`).

Rules both sides keep: a process is the recorded one only when its pid and its start time in clock ticks
(`/proc/<pid>/stat` field 22) both match, so a reused pid is never signalled; a new field gets a default,
so a record an older agent wrote still reads; a reader skips a file that is not a readable record
(`BAD_RECORD` lists what reading one may raise), since the work dir may hold other `*.json` files.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpusched_common.files import write_private

# What reading a damaged record may raise: unreadable, not JSON or not UTF-8, or not a record's fields.
BAD_RECORD = (OSError, ValueError, TypeError, KeyError, AttributeError)


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    pid: int
    gpu_indices: tuple[int, ...]
    started_at_s: float  # wall clock at start
    proc_start_ticks: int | None = None
    lease_epoch: int = 0
    share_milli: int | None = None
    memory_mib: int | None = None
    attempt: int = 1  # the job's run on this cluster (a requeued or resumed job runs again)
    time_limit_s: float | None = None  # stopped after this long (kept here: an agent restarted enforces it)
    container: bool = False  # runs in a container (of the node's runtime): removed when its client is killed


def record_path(work_dir: Path, job_id: str) -> Path:
    return work_dir / f"{job_id}.json"


def write_record(work_dir: Path, record: JobRecord) -> None:
    """Write the record, readable by the agent's user alone (a job may run as another user on the node)."""
    write_private(record_path(work_dir, record.job_id), json.dumps(asdict(record)))


def read_record(path: Path) -> JobRecord | None:
    """The record in `path`, None where there is no such file; raises one of `BAD_RECORD` where the file
    is not a readable record."""
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    doc["gpu_indices"] = tuple(doc["gpu_indices"])
    return JobRecord(**doc)


def read_records(work_dir: Path, skipped: Callable[[Path, Exception], None]) -> list[JobRecord]:
    """Every readable record in one work dir, by file name; `skipped` hears of each file that is not one."""
    records = []
    for path in sorted(work_dir.glob("*.json")):
        try:
            record = read_record(path)
        except BAD_RECORD as exc:
            skipped(path, exc)
            continue
        if record is not None:
            records.append(record)
    return records


def stop_job_groups(records: Iterable[JobRecord], grace_s: float = 5.0, kill_wait_s: float = 5.0) -> tuple[int, int]:
    """Stop jobs without their agent (when a whole stack goes down), all at once: SIGTERM the process group
    of every job whose process still runs (same pid and start ticks, so a reused pid is never signalled),
    SIGKILL the groups with a process left after `grace_s`, wait up to `kill_wait_s` for those to go.
    Returns (jobs signalled, groups that needed SIGKILL)."""
    groups = {r.pid: r.proc_start_ticks for r in records if _leads_own_group(r.pid, r.proc_start_ticks)}
    for pgid in groups:
        signal_group(pgid, signal.SIGTERM)
    left = _wait_groups_gone(groups, grace_s)
    for pgid in left:
        signal_group(pgid, signal.SIGKILL)
    _wait_groups_gone(left, kill_wait_s)
    return len(groups), len(left)


def _leads_own_group(pid: object, ticks: object) -> bool:
    """`pid` is the same process as recorded (its start ticks match) and leads its own process group, as
    every job wrapper does; a record without start ticks cannot be told from a reused pid."""
    if type(pid) is not int or type(ticks) is not int or pid <= 1 or pid == os.getpid():
        return False
    fields = _stat_fields(pid)
    return fields is not None and len(fields) > 2 and fields[2] == str(pid) and alive(pid, ticks)


def _wait_groups_gone(groups: dict[int, int], timeout_s: float) -> dict[int, int]:
    """Wait until no process is left in `groups` (leader pid -> its start ticks); the groups left."""
    deadline = time.monotonic() + timeout_s
    left = _groups_left(groups)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _groups_left(left)
    return left


def _groups_left(groups: dict[int, int]) -> dict[int, int]:
    """The groups that still have a live member, but none whose leader pid now runs another process (a
    pid is only reused once its old group is empty)."""
    members = group_members(set(groups))
    return {g: t for g, t in groups.items() if members.get(g) and start_ticks(g) in (None, t)}


def group_members(pgids: set[int]) -> dict[int, list[int]]:
    """Process group id -> the live (not zombie) processes in it, for the groups in `pgids`; one /proc scan."""
    members: dict[int, list[int]] = {}
    if not pgids:
        return members
    for entry in os.listdir("/proc"):
        fields = _stat_fields(int(entry)) if entry.isdigit() else None
        if fields is not None and len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in pgids:
            members.setdefault(int(fields[2]), []).append(int(entry))
    return members


def terminate_job(wrapper_pid: int) -> int:
    """SIGTERM every process of the job's group except the wrapper, which must live to record the code; how
    many were signalled (0: the wrapper has not started the job's command yet)."""
    signalled = 0
    for pid in group_members({wrapper_pid}).get(wrapper_pid, []):
        if pid == wrapper_pid:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
            signalled += 1
        except (ProcessLookupError, PermissionError):
            pass
    return signalled


def signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (None where it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def alive(pid: int, ticks: int | None = None) -> bool:
    """`pid` runs, is no zombie and, where `ticks` is given, is the process that started then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat_fields(pid)
    if fields is None:
        return True
    if fields[0] == "Z":  # a zombie child of a dead agent is reaped by init; treat it as finished
        return False
    # a different process that reused the pid is not our job
    return ticks is None or start_ticks(pid) == ticks
