"""Runs jobs as subprocesses and remembers them on disk, so a restarted agent neither starts a job twice
nor loses the exit code of one that finished while it was down.

Each job runs under `sh` in its own session (so its whole process group can be stopped), in a directory of
its own (`jobs/<job>/`, its working directory and HOME, where it finds its checkpoint file and preemption
notice), which writes the command's exit code to `jobs/<job>/exit` when it ends; the job's record
(`<job>.json`, with the process's start time so a reused pid is not mistaken for it) is written before the
job's start is reported. Output goes to `<job>.log`. The lease epoch is kept in `lease_epoch`. The agent's
own files are beside the job directories, not in them, and created private (mode 0600); the agent's
directories may be passed through (0711) but not listed. A job's environment is an allowlist of the
agent's (``gpusched_core.jobenv``): never its database URL or keys. Where the agent runs as root and maps
tenants to users (``RunAs``), each job runs as its tenant's unprivileged user and owns only its directory.
The record's format and the process-group helpers are shared with `gpusched down`, which reads the
records: see gpusched_common/job_records.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gpusched_common.files import write_private
from gpusched_common.ids import is_valid_id
from gpusched_core.agent.retention import KeptLog
from services.node_agent.cgroups import CPU_PERIOD_US, NO_CGROUPS, JobCgroups, Limits
from gpusched_common.job_records import (
    BAD_RECORD, JobRecord, alive, read_record, read_records, record_path, signal_group, start_ticks, terminate_job,
    write_record,
)
from gpusched_core.agent.reconcile import ObservedJob
from gpusched_core.agent.container import ContainerRun
from gpusched_core.jobenv import job_environment

from services.node_agent.containers import ContainerRuntime
from services.node_agent.spawn import exit_of, spawn_gated

__all__ = ["JobExit", "JobRecord", "JobRunner"]
log = logging.getLogger(__name__)
RUN_MARKS = ("reported", "stopped")  # what the agent notes of a run beside its record
RUN_FILES = ("json", *RUN_MARKS)  # a run's own files beside the job directories, set aside when it ended
JOB_RUN_FILES = ("exit", "preempt-notice")  # and in the job's directory
LEGACY_RUN_FILES = ("exit", "preempt")  # where an agent before job directories kept them (``<job>.exit``)

# The wrapper records the job's exit code. A polite stop (SIGTERM) goes to the job's processes but not to
# the wrapper (see `terminate_job`), so the job can checkpoint in its grace period and its own exit code
# is what gets recorded; SIGKILL at the deadline takes the whole process group.
# The job's shell: it waits at its start gate (its stdin, a pipe) until the agent moved it into its cgroup
# (no gate line: the agent is gone, and the job does not run), then runs the command with no stdin.
_WRAPPER = ('read -r _gate || exit 125; cd "$GPUSCHED_JOB_DIR" || exit 126; "$@" </dev/null; code=$?; '
            'echo $code > "$GPUSCHED_EXIT_FILE"; exit $code')


@dataclass(frozen=True)
class RunAs:
    """Which user runs a tenant's jobs (the agent runs as root): ``users`` by tenant, ``default`` for the
    rest (None: a tenant not listed is refused)."""

    users: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None

    @classmethod
    def parse(cls, text: str) -> RunAs | None:
        """``research=svc-research,*=nobody`` (empty: None, jobs run as the agent's user)."""
        users, default = {}, None
        for item in (part.strip() for part in text.split(",") if part.strip()):
            tenant, sep, user = item.partition("=")
            if not sep or not tenant.strip() or not user.strip():
                raise ValueError(f"GPUSCHED_AGENT_JOB_USERS: {item!r} is not tenant=user")
            if tenant.strip() == "*":
                default = user.strip()
            else:
                users[tenant.strip()] = user.strip()
        return cls(users, default) if users or default else None

    def describe(self) -> str:
        return ",".join([*(f"{t}={u}" for t, u in sorted(self.users.items())),
                         *([f"*={self.default}"] if self.default else [])])

    def user_for(self, tenant: str | None) -> pwd.struct_passwd | str:
        """The tenant's user entry, or why its jobs cannot run."""
        name = self.users.get(tenant or "", self.default)
        if name is None:
            return f"no user is mapped to run tenant {tenant}'s jobs (GPUSCHED_AGENT_JOB_USERS)"
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return f"user {name!r} mapped to tenant {tenant} does not exist on this node"
        if entry.pw_uid == 0:
            return f"user {name!r} mapped to tenant {tenant} is root; jobs run unprivileged"
        return entry


@dataclass(frozen=True)
class JobExit:
    job_id: str
    exit_code: int
    runtime_s: float
    error: str | None = None


class JobRunner:
    def __init__(self, work_dir: Path, run_as: RunAs | None = None, env_passthrough: Iterable[str] = (),
                 cgroups: JobCgroups | None = None, containers: ContainerRuntime | None = None) -> None:
        if run_as is not None and os.geteuid() != 0:
            raise ValueError("GPUSCHED_AGENT_JOB_USERS maps tenants to users, which needs the agent to run as root")
        self._dir = work_dir
        self._jobs = work_dir / "jobs"
        self._jobs.mkdir(parents=True, exist_ok=True)
        for directory in (self._dir, self._jobs):  # passed through to a job's own directory, never listed
            directory.chmod(0o711)
        if run_as is not None:
            closed = [p for p in self._dir.resolve().parents if not p.stat().st_mode & 0o001]
            if closed:
                raise ValueError(f"{closed[0]} may not be passed through by other users, so jobs running as their "
                                 f"tenant's user could not reach their directories under {self._jobs}")
        self._run_as = run_as
        self._passthrough = tuple(env_passthrough)
        self.cgroups = cgroups if cgroups is not None else JobCgroups(NO_CGROUPS)
        self._procs: dict[str, subprocess.Popen] = {}
        self.containers = containers

    @property
    def work_dir(self) -> Path:
        return self._dir

    def isolation(self) -> dict[str, str]:
        """What this node enforces on each job, for its registration (``gpusched nodes`` shows it)."""
        users = (f"each tenant's jobs as its own user ({self._run_as.describe()})" if self._run_as is not None
                 else "not enforced: jobs run as the agent's user")
        return {**self.cgroups.support.isolation(), "users": users,
                "environment": "allowlist (PATH, locale, TZ" + (f", {', '.join(self._passthrough)}" if self._passthrough
                                                               else "") + "), own directory"}

    def sweep_cgroups(self) -> int:
        """Remove the cgroups left by this node's jobs that no longer run (see ``JobCgroups.sweep``)."""
        return self.cgroups.sweep({r.job_id for r in self.records() if self.is_alive(r)})

    def known(self, job_id: str) -> bool:
        return record_path(self._dir, job_id).exists()

    def record(self, job_id: str) -> JobRecord | None:
        """The job's record; raises where its file is not a readable record (see gpusched_common.job_records)."""
        return read_record(record_path(self._dir, job_id))

    def records(self) -> list[JobRecord]:
        """Every job recorded here; a `*.json` that is not a readable record (a file of someone else's, or a
        damaged one) is skipped and logged, not a reason for the agent to stop."""
        return read_records(self._dir, self._skipped)

    def _skipped(self, path: Path, exc: Exception) -> None:
        log.warning("skipped %s: not a readable job record (%s: %s)", path, type(exc).__name__, exc)

    def is_alive(self, record: JobRecord) -> bool:
        return alive(record.pid, record.proc_start_ticks) and not self._exit_path(record.job_id).exists()

    def observe(self) -> list[ObservedJob]:
        """Every recorded job as the reconcile core sees it."""
        out = []
        for r in self.records():
            runs = self.is_alive(r)
            out.append(ObservedJob(r.job_id, r.pid, runs, None if runs else self._read_exit(r.job_id),
                                   self.reported(r.job_id), self.stop_reason(r.job_id), r.attempt))
        return out

    def finish_run(self, job_id: str) -> None:
        """Set a finished, reported run aside so the same job can run here again (after a preemption or a
        requeue); its log and checkpoint file stay, a resumed run appends to the one and reads the other."""
        record = self.record(job_id)
        if record is None:
            return
        for suffix in (*RUN_FILES, *LEGACY_RUN_FILES):
            path = self._dir / f"{job_id}.{suffix}"
            if path.exists():
                path.rename(self._dir / f"{job_id}.{suffix}.run{record.attempt}")
        for name in JOB_RUN_FILES:
            path = self.job_dir(job_id) / name
            if path.exists():
                path.rename(path.with_name(f"{name}.run{record.attempt}"))

    def reported(self, job_id: str) -> bool:
        return (self._dir / f"{job_id}.reported").exists()

    def mark_reported(self, job_id: str, report: str = "", attempt: int | None = None) -> bool:
        """The end of the job's recorded run was reported (``report``: the exit report as sent, kept to send
        again should the store still expect the job here: the report was lost after the broker took it).
        ``attempt``: the run the report was about. Where the recorded run is another (an earlier run's report
        taken late, after the next run started here) or none, nothing is marked (False): a mark on a run it is
        not about would let a later StartJob replace that run while it still runs."""
        try:
            record = self.record(job_id)
        except BAD_RECORD:
            record = None
        if record is None or (attempt is not None and record.attempt != attempt):
            log.info("job %s: the report of run %s was taken; the run recorded here is %s: not marked", job_id,
                     attempt, "none" if record is None else record.attempt)
            return False
        write_private(self._dir / f"{job_id}.reported", report)
        return True

    def note_stop(self, job_id: str, reason_code: str) -> None:
        """The agent is stopping the run for ``reason_code`` (an ExitReason): kept beside the record, so an
        agent started again meanwhile reports its end with that reason (a run fenced for a lost lease is
        requeued, not failed with the SIGTERM's 143)."""
        if record_path(self._dir, job_id).exists() and self.stop_reason(job_id) is None:
            write_private(self._dir / f"{job_id}.stopped", reason_code)

    def stop_reason(self, job_id: str) -> str | None:
        """Why the agent stopped the run (None: it did not)."""
        try:
            return (self._dir / f"{job_id}.stopped").read_text().strip() or None
        except OSError:
            return None

    def reported_exit(self, job_id: str) -> str | None:
        """The exit report sent for the job's run (None: none kept, or nothing reported)."""
        try:
            return (self._dir / f"{job_id}.reported").read_text() or None
        except OSError:
            return None

    def log_path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.log"

    def job_dir(self, job_id: str) -> Path:
        """The job's own directory: its working directory and HOME, its checkpoint file and notices."""
        return self._jobs / job_id

    def kept_logs(self) -> list[KeptLog]:
        """Every job log here, with its last write and whether the job has a current run."""
        out = []
        for path in self._dir.glob("*.log"):
            try:
                out.append(KeptLog(path.stem, path.stat().st_mtime, record_path(self._dir, path.stem).exists()))
            except FileNotFoundError:
                continue
        return out

    def forget_output(self, job_id: str) -> None:
        """Delete a job's log, its directory and the files of its finished runs (``finish_run`` set them aside)."""
        set_aside = [p for suffix in (*RUN_FILES, *LEGACY_RUN_FILES) for p in self._dir.glob(f"{job_id}.{suffix}.run*")]
        for path in [self.log_path(job_id), *set_aside]:
            path.unlink(missing_ok=True)
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def running_job_ids(self) -> list[str]:
        return [r.job_id for r in self.records() if self.is_alive(r)]

    def job_of_session(self) -> dict[int, str]:
        """Session (= process group) leader pid -> job id, for live jobs."""
        return {r.pid: r.job_id for r in self.records() if self.is_alive(r)}

    def next_epoch(self, at_least: int = 0) -> int:
        """A lease epoch larger than any this node used before (kept on disk across restarts), and at least
        ``at_least`` (the store's floor, told by placement: a wiped directory forgot the node's epochs)."""
        path = self._dir / "lease_epoch"
        try:
            previous = int(path.read_text().strip())
        except (OSError, ValueError):
            previous = 0
        epoch = max(previous + 1, at_least)
        write_private(path, str(epoch))
        return epoch

    async def start(self, job_id: str, command: list[str], gpu_indices: tuple[int, ...], env: Mapping[str, str],
                    *, lease_epoch: int = 0, share_milli: int | None = None,
                    memory_mib: int | None = None, attempt: int = 1,
                    time_limit_s: float | None = None, owned: Mapping[str, str] | None = None,
                    tenant: str | None = None, limits: Limits | None = None, image: str | None = None,
                    devices: tuple[str, ...] = (), args: tuple[str, ...] = ()) -> JobRecord | JobExit:
        """Start `command` with `env` (the job's own and what placement told it) over an allowlist of the
        agent's environment; `owned` (the agent's: GPU devices, MPS limits) and the job's files come last.
        With an `image`, the command (or the image's entrypoint) runs in a container of it, with `devices`."""
        if not is_valid_id(job_id):
            return JobExit(job_id, 127, 0.0, error=f"invalid job id {job_id!r}")
        if image is not None and self.containers is None:
            return JobExit(job_id, 127, 0.0, error=f"this node runs no containers (image {image})")
        user = self._run_as.user_for(tenant) if self._run_as is not None else None
        if isinstance(user, str):
            return JobExit(job_id, 127, 0.0, error=user)
        directory = self.job_dir(job_id)
        directory.mkdir(mode=0o700, exist_ok=True)
        if user is not None:
            os.chown(directory, user.pw_uid, user.pw_gid)
        # marks and exit codes of no recorded run are not this run's (it would look ended, or reported, at once)
        for stale in [*(self._dir / f"{job_id}.{suffix}" for suffix in (*RUN_MARKS, *LEGACY_RUN_FILES)),
                      *(directory / name for name in JOB_RUN_FILES)]:
            stale.unlink(missing_ok=True)
        exit_path = self._exit_path(job_id)
        job_env = job_environment(os.environ, self._passthrough, env, {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices), **(owned or {}),
            "GPUSCHED_JOB_ID": job_id, "GPUSCHED_EXIT_FILE": str(exit_path), "GPUSCHED_JOB_DIR": str(directory),
            "HOME": str(directory), "TMPDIR": str(directory),
            # the job writes its latest checkpoint reference here; a preemption notice appears there
            "GPUSCHED_CHECKPOINT_FILE": str(self._checkpoint_path(job_id)),
            "GPUSCHED_PREEMPT_NOTICE_FILE": str(self._notice_path(job_id))})
        if image is not None and self.containers is not None:
            command = self.containers.command(ContainerRun(
                job_id, self._dir.name, attempt, image, command, str(directory),
                devices if self.containers.devices else (),
                round(limits.cpu_quota_us * 1000 / CPU_PERIOD_US) if limits and limits.cpu_quota_us else 0,
                (limits.memory_bytes or 0) // 2**20 if limits else 0, (user.pw_uid, user.pw_gid) if user is not None else None,
                job_env.get("CUDA_MPS_PIPE_DIRECTORY"), args), job_env)
        started = time.time()
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []} if user is not None else {}
        argv = ["sh", "-c", _WRAPPER, "gpusched-job", *command]

        def spawn() -> tuple[subprocess.Popen, JobRecord] | JobExit:
            proc, problems = spawn_gated(argv, job_env, as_user, self.log_path(job_id), self.cgroups, job_id, limits)
            if proc is None:
                return JobExit(job_id, 127, 0.0, error=problems)
            if problems:
                log.warning("job %s runs without some of its limits: %s", job_id, "; ".join(problems))
            record = JobRecord(job_id, proc.pid, tuple(gpu_indices), started, start_ticks(proc.pid), lease_epoch,
                               share_milli, memory_mib, attempt, time_limit_s, container=image is not None)
            write_record(self._dir, record)  # in the same thread: a started job is never left unrecorded
            return proc, record

        # in a worker thread (see ``spawn``): the agent's loop goes on with its heartbeats meanwhile
        started_run = await asyncio.to_thread(spawn)
        if isinstance(started_run, JobExit):
            return started_run
        proc, record = started_run
        self._procs[job_id] = proc  # else (cancelled just now) ``wait`` finds the run by its record
        return record

    async def wait(self, record: JobRecord) -> JobExit:
        """Wait for a job started by this process or adopted after a restart."""
        proc = self._procs.get(record.job_id)
        if proc is not None:
            code = await exit_of(proc)
            self._procs.pop(record.job_id, None)
            if code < 0:  # killed by a signal before the wrapper could record a code
                code = 128 - code
        else:
            while self.is_alive(record):
                await asyncio.sleep(0.2)
            code = self._read_exit(record.job_id)
        self.cgroups.remove(record.job_id)
        return JobExit(record.job_id, code, max(0.0, time.time() - record.started_at_s))

    async def stop(self, job_id: str, grace_s: float = 0.0) -> bool:
        """SIGTERM the job's process group, SIGKILL it after `grace_s`; False when it was not running."""
        record = self.record(job_id)
        if record is None or not alive(record.pid, record.proc_start_ticks):
            return False
        signalled = terminate_job(record.pid) if grace_s > 0 else 0
        if grace_s <= 0:
            signal_group(record.pid, signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while grace_s > 0 and time.monotonic() < deadline and alive(record.pid, record.proc_start_ticks):
            if not signalled:  # stopped just as it started: the command had not begun; it has the SIGTERM now
                signalled = terminate_job(record.pid)
            await asyncio.sleep(0.05)
        signal_group(record.pid, signal.SIGKILL)
        if record.container and self.containers is not None:  # the container outlives its killed client
            await self.containers.remove(self._dir.name, job_id, record.attempt)
        return True

    def write_preempt_notice(self, job_id: str, deadline_at: datetime, reason: str) -> None:
        """The notice a job can poll for (beside SIGTERM): when it will be killed and why."""
        notice = {"deadline_at": deadline_at.isoformat(), "reason": reason}
        path = self._notice_path(job_id)
        path.write_text(json.dumps(notice) + "\n")
        path.chmod(0o644)  # the job, perhaps another user, reads it

    def read_checkpoint(self, job_id: str) -> str | None:
        """The checkpoint reference the job last wrote (first line of its checkpoint file), if any."""
        try:
            ref = self._checkpoint_path(job_id).read_text().strip().splitlines()
        except OSError:
            return None
        return ref[0][:1024] if ref and ref[0] else None

    def _checkpoint_path(self, job_id: str) -> Path:
        legacy = self._dir / f"{job_id}.checkpoint"
        return legacy if legacy.exists() else self.job_dir(job_id) / "checkpoint"

    def _notice_path(self, job_id: str) -> Path:
        return self.job_dir(job_id) / "preempt-notice"

    def _read_exit(self, job_id: str) -> int:
        try:
            return int(self._exit_path(job_id).read_text().strip())
        except (OSError, ValueError):
            return 137  # vanished without a recorded exit code: treat as killed

    def _exit_path(self, job_id: str) -> Path:
        legacy = self._dir / f"{job_id}.exit"  # a job started by an agent before job directories
        return legacy if legacy.exists() else self.job_dir(job_id) / "exit"
