"""Runs jobs as subprocesses and remembers them on disk, so a restarted agent neither starts a job twice
nor loses the exit code of one that finished while it was down.

Each job runs under `sh` in its own session (so its whole process group can be stopped), which writes the
command's exit code to `<job>.exit` when it ends; the job's record (`<job>.json`, with the process's start
time so a reused pid is not mistaken for it) is written before the job's start is reported. Output goes
to `<job>.log`. The lease epoch is kept in `lease_epoch`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from gpusched_common.ids import is_valid_id

from services.node_agent.reconcile import ObservedJob

# The wrapper records the job's exit code. A polite stop (SIGTERM) goes to the job's processes but not to
# the wrapper (see `_terminate_job`), so the job can checkpoint in its grace period and its own exit code
# is what gets recorded; SIGKILL at the deadline takes the whole process group.
_WRAPPER = 'cd "$GPUSCHED_JOB_DIR" 2>/dev/null; "$@"; code=$?; echo $code > "$GPUSCHED_EXIT_FILE"; exit $code'


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


@dataclass(frozen=True)
class JobExit:
    job_id: str
    exit_code: int
    runtime_s: float
    error: str | None = None


class JobRunner:
    def __init__(self, work_dir: Path) -> None:
        self._dir = work_dir
        self._dir.mkdir(parents=True, exist_ok=True)
        self._procs: dict[str, asyncio.subprocess.Process] = {}

    @property
    def work_dir(self) -> Path:
        return self._dir

    def known(self, job_id: str) -> bool:
        return (self._dir / f"{job_id}.json").exists()

    def record(self, job_id: str) -> JobRecord | None:
        path = self._dir / f"{job_id}.json"
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        doc["gpu_indices"] = tuple(doc["gpu_indices"])
        return JobRecord(**doc)

    def records(self) -> list[JobRecord]:
        return [r for r in (self.record(p.stem) for p in sorted(self._dir.glob("*.json"))) if r is not None]

    def is_alive(self, record: JobRecord) -> bool:
        return _alive(record.pid, record.proc_start_ticks) and not self._exit_path(record.job_id).exists()

    def observe(self) -> list[ObservedJob]:
        """Every recorded job as the reconcile core sees it."""
        out = []
        for r in self.records():
            alive = self.is_alive(r)
            out.append(ObservedJob(r.job_id, r.pid, alive, None if alive else self._read_exit(r.job_id),
                                   self.reported(r.job_id)))
        return out

    def finish_run(self, job_id: str) -> None:
        """Set a finished, reported run aside so the same job can run here again (after a preemption or a
        requeue); its log and checkpoint file stay, a resumed run appends to the one and reads the other."""
        record = self.record(job_id)
        if record is None:
            return
        for suffix in ("json", "exit", "reported", "preempt"):
            path = self._dir / f"{job_id}.{suffix}"
            if path.exists():
                path.rename(self._dir / f"{job_id}.{suffix}.run{record.attempt}")

    def reported(self, job_id: str) -> bool:
        return (self._dir / f"{job_id}.reported").exists()

    def mark_reported(self, job_id: str) -> None:
        (self._dir / f"{job_id}.reported").touch()

    def log_path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.log"

    def running_job_ids(self) -> list[str]:
        return [r.job_id for r in self.records() if self.is_alive(r)]

    def job_of_session(self) -> dict[int, str]:
        """Session (= process group) leader pid -> job id, for live jobs."""
        return {r.pid: r.job_id for r in self.records() if self.is_alive(r)}

    def next_epoch(self) -> int:
        """A lease epoch larger than any this node used before (kept on disk across restarts)."""
        path = self._dir / "lease_epoch"
        try:
            previous = int(path.read_text().strip())
        except (OSError, ValueError):
            previous = 0
        epoch = previous + 1
        path.write_text(str(epoch))
        return epoch

    async def start(self, job_id: str, command: list[str], gpu_indices: tuple[int, ...], env: dict[str, str],
                    *, lease_epoch: int = 0, share_milli: int | None = None,
                    memory_mib: int | None = None, attempt: int = 1) -> JobRecord | JobExit:
        """Start `command`; `env` is added to the agent's environment (and includes CUDA_VISIBLE_DEVICES)."""
        if not is_valid_id(job_id):
            return JobExit(job_id, 127, 0.0, error=f"invalid job id {job_id!r}")
        exit_path = self._exit_path(job_id)
        job_env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices), **env,
                   "GPUSCHED_JOB_ID": job_id, "GPUSCHED_EXIT_FILE": str(exit_path), "GPUSCHED_JOB_DIR": str(self._dir),
                   # the job writes its latest checkpoint reference here; a preemption notice appears there
                   "GPUSCHED_CHECKPOINT_FILE": str(self._checkpoint_path(job_id)),
                   "GPUSCHED_PREEMPT_NOTICE_FILE": str(self._dir / f"{job_id}.preempt")}
        started = time.time()
        log = self.log_path(job_id).open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                "sh", "-c", _WRAPPER, "gpusched-job", *command, env=job_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True)  # own process group, for clean stops
        except OSError as exc:
            return JobExit(job_id, 127, 0.0, error=f"could not start command: {exc}")
        finally:
            log.close()
        record = JobRecord(job_id, proc.pid, tuple(gpu_indices), started, _start_ticks(proc.pid), lease_epoch,
                           share_milli, memory_mib, attempt)
        (self._dir / f"{job_id}.json").write_text(json.dumps(asdict(record)))
        self._procs[job_id] = proc
        return record

    async def wait(self, record: JobRecord) -> JobExit:
        """Wait for a job started by this process or adopted after a restart."""
        proc = self._procs.get(record.job_id)
        if proc is not None:
            code = await proc.wait()
            self._procs.pop(record.job_id, None)
            if code < 0:  # killed by a signal before the wrapper could record a code
                code = 128 - code
        else:
            while self.is_alive(record):
                await asyncio.sleep(0.2)
            code = self._read_exit(record.job_id)
        return JobExit(record.job_id, code, max(0.0, time.time() - record.started_at_s))

    async def stop(self, job_id: str, grace_s: float = 0.0) -> bool:
        """SIGTERM the job's process group, SIGKILL it after `grace_s`; False when it was not running."""
        record = self.record(job_id)
        if record is None or not _alive(record.pid, record.proc_start_ticks):
            return False
        if grace_s > 0:
            _terminate_job(record.pid)
        else:
            _signal_group(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while grace_s > 0 and time.monotonic() < deadline and _alive(record.pid, record.proc_start_ticks):
            await asyncio.sleep(0.05)
        _signal_group(record.pid, signal.SIGKILL)
        return True

    def write_preempt_notice(self, job_id: str, deadline_at: datetime, reason: str) -> None:
        """The notice a job can poll for (beside SIGTERM): when it will be killed and why."""
        notice = {"deadline_at": deadline_at.isoformat(), "reason": reason}
        (self._dir / f"{job_id}.preempt").write_text(json.dumps(notice) + "\n")

    def read_checkpoint(self, job_id: str) -> str | None:
        """The checkpoint reference the job last wrote (first line of its checkpoint file), if any."""
        try:
            ref = self._checkpoint_path(job_id).read_text().strip().splitlines()
        except OSError:
            return None
        return ref[0][:1024] if ref and ref[0] else None

    def _checkpoint_path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.checkpoint"

    def _read_exit(self, job_id: str) -> int:
        try:
            return int(self._exit_path(job_id).read_text().strip())
        except (OSError, ValueError):
            return 137  # vanished without a recorded exit code: treat as killed

    def _exit_path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.exit"


def stop_job_groups(records: Iterable[JobRecord], grace_s: float = 5.0, kill_wait_s: float = 5.0) -> tuple[int, int]:
    """Stop jobs without their agent (when a whole stack goes down), all at once: SIGTERM the process group
    of every job whose process still runs (same pid and start ticks, so a reused pid is never signalled),
    SIGKILL the groups with a process left after `grace_s`, wait up to `kill_wait_s` for those to go.
    Returns (jobs signalled, groups that needed SIGKILL)."""
    groups = {r.pid: r.proc_start_ticks for r in records if _leads_own_group(r.pid, r.proc_start_ticks)}
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    left = _wait_groups_gone(groups, grace_s)
    for pgid in left:
        _signal_group(pgid, signal.SIGKILL)
    _wait_groups_gone(left, kill_wait_s)
    return len(groups), len(left)


def _leads_own_group(pid: object, start_ticks: object) -> bool:
    """`pid` is the same process as recorded (its start ticks match) and leads its own process group, as
    every job wrapper does; a record without start ticks cannot be told from a reused pid."""
    if type(pid) is not int or type(start_ticks) is not int or pid <= 1 or pid == os.getpid():
        return False
    fields = _stat_fields(pid)
    return fields is not None and len(fields) > 2 and fields[2] == str(pid) and _alive(pid, start_ticks)


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
    members = _group_members(set(groups))
    return {g: t for g, t in groups.items() if members.get(g) and _start_ticks(g) in (None, t)}


def _group_members(pgids: set[int]) -> dict[int, list[int]]:
    """Process group id -> the live (not zombie) processes in it, for the groups in `pgids`; one /proc scan."""
    members: dict[int, list[int]] = {}
    if not pgids:
        return members
    for entry in os.listdir("/proc"):
        fields = _stat_fields(int(entry)) if entry.isdigit() else None
        if fields is not None and len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in pgids:
            members.setdefault(int(fields[2]), []).append(int(entry))
    return members


def _terminate_job(wrapper_pid: int) -> None:
    """SIGTERM every process of the job's group except the wrapper, which must live to record the code."""
    for pid in _group_members({wrapper_pid}).get(wrapper_pid, []):
        if pid == wrapper_pid:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_group(pid: int, sig: signal.Signals) -> None:
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


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _alive(pid: int, start_ticks: int | None = None) -> bool:
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
    return start_ticks is None or _start_ticks(pid) == start_ticks
