"""Runs jobs as subprocesses and remembers them on disk, so a restarted agent neither starts a job twice
nor loses the exit code of one that finished while it was down.

Each job runs under `sh`, which writes the command's exit code to `<job>.exit` when it ends; the job's
record (`<job>.json`) is written before the job's start is reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_WRAPPER = 'cd "$GPUSCHED_JOB_DIR" 2>/dev/null; "$@"; code=$?; echo $code > "$GPUSCHED_EXIT_FILE"; exit $code'


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    pid: int
    gpu_indices: tuple[int, ...]
    started_at_s: float  # wall clock at start


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

    def known(self, job_id: str) -> bool:
        return (self._dir / f"{job_id}.json").exists()

    def records(self) -> list[JobRecord]:
        out = []
        for path in sorted(self._dir.glob("*.json")):
            doc = json.loads(path.read_text())
            out.append(JobRecord(doc["job_id"], doc["pid"], tuple(doc["gpu_indices"]), doc["started_at_s"]))
        return out

    def unreported(self) -> list[JobRecord]:
        """Jobs whose exit has not been reported yet (running, or finished while the agent was down)."""
        return [r for r in self.records() if not (self._dir / f"{r.job_id}.reported").exists()]

    def mark_reported(self, job_id: str) -> None:
        (self._dir / f"{job_id}.reported").touch()

    def log_path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.log"

    def running_job_ids(self) -> list[str]:
        return [r.job_id for r in self.records() if not self._exit_path(r.job_id).exists()]

    async def start(self, job_id: str, command: list[str], gpu_indices: tuple[int, ...],
                    env: dict[str, str]) -> JobRecord | JobExit:
        exit_path = self._exit_path(job_id)
        job_env = {**os.environ, **env,
                   "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices),
                   "GPUSCHED_JOB_ID": job_id, "GPUSCHED_EXIT_FILE": str(exit_path),
                   "GPUSCHED_JOB_DIR": str(self._dir)}
        started = time.time()
        log = (self._dir / f"{job_id}.log").open("ab")
        try:
            proc = await asyncio.create_subprocess_exec(
                "sh", "-c", _WRAPPER, "gpusched-job", *command, env=job_env, stdin=asyncio.subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True)  # own process group, for clean stops
        except OSError as exc:
            return JobExit(job_id, 127, 0.0, error=f"could not start command: {exc}")
        finally:
            log.close()
        record = JobRecord(job_id, proc.pid, gpu_indices, started)
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
            while _alive(record.pid) and not self._exit_path(record.job_id).exists():
                await asyncio.sleep(0.5)
            code = self._read_exit(record.job_id)
        return JobExit(record.job_id, code, max(0.0, time.time() - record.started_at_s))

    def stop(self, job_id: str) -> None:
        for record in self.records():
            if record.job_id == job_id and _alive(record.pid):
                try:
                    os.killpg(record.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _read_exit(self, job_id: str) -> int:
        try:
            return int(self._exit_path(job_id).read_text().strip())
        except (OSError, ValueError):
            return 137  # vanished without a recorded exit code: treat as killed

    def _exit_path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.exit"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of a dead agent is reaped by init; treat a zombie as finished
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True
