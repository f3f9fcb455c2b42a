"""Each job in a cgroup of its own, with the CPU and memory it asked for as limits and, where the node
allows it, only its own GPUs' device files (issue 14).

What a node can enforce depends on the node (``detect``), and the agent says what it enforces in its
registration (``NodeRegistered.isolation``, shown by ``gpusched nodes``):

- **cgroup v2** (``/sys/fs/cgroup/cgroup.controllers`` lists ``cpu`` and ``memory``): the job's cgroup is
  ``<root>/gpusched/<node>/<job>`` with ``cpu.max`` and ``memory.max``; device files are not limited (v2
  does that with an eBPF program, which the agent does not load);
- **cgroup v1** (writable ``cpu``, ``memory`` and ``devices`` hierarchies): the job's cgroup is
  ``<hierarchy>/<the agent's own cgroup>/gpusched/<node>/<job>`` in each, with ``cpu.cfs_quota_us`` and
  ``memory.limit_in_bytes``, and ``devices.deny`` for the NVIDIA device files (``c 195:<minor>``) of every
  GPU of the node that is not the job's;
- **none** (not root, no writable hierarchy, a container without its cgroups): nothing is limited, and
  the node says so.

A job is moved into its cgroup before it runs its command: the agent starts the job's wrapper, writes the
wrapper's pid into the cgroup, then opens the wrapper's start gate (a pipe it waits on), so nothing the job
starts escapes. Limits are pure (``limits_for``); the cgroup's files are the shell.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195
CPU_PERIOD_US = 100_000
MIN_MEMORY_MIB = 16  # a smaller limit would kill the wrapper itself


@dataclass(frozen=True)
class Limits:
    cpu_quota_us: int | None  # per CPU_PERIOD_US (None: no CPU limit)
    memory_bytes: int | None
    denied_minors: tuple[int, ...]  # NVIDIA device minors the job may not open


def limits_for(cpu_milli: int, memory_mib: int, gpu_indices: tuple[int, ...], minors: dict[int, int]) -> Limits:
    """The limits of a job asking ``cpu_milli`` and ``memory_mib`` (0: no limit) on GPUs ``gpu_indices`` of
    a node whose GPUs have device ``minors`` by index (pure)."""
    quota = max(1000, cpu_milli * CPU_PERIOD_US // 1000) if cpu_milli > 0 else None
    memory = max(memory_mib, MIN_MEMORY_MIB) * 1024 * 1024 if memory_mib > 0 else None
    denied = tuple(sorted(minor for index, minor in minors.items() if index not in gpu_indices))
    return Limits(quota, memory, denied)


@dataclass(frozen=True)
class Support:
    """What this node enforces: ``mode`` v2, v1 or none, and a sentence per limit for ``gpusched nodes``."""

    mode: str
    cpu: str
    memory: str
    devices: str
    hierarchies: tuple[tuple[str, Path], ...] = ()  # (controller, the directory job cgroups go under)

    def isolation(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "devices": self.devices}


def _own_path(controller: str, proc_cgroup: str) -> str:
    """The agent's own cgroup in a v1 hierarchy (``4:memory:/a/b`` -> ``a/b``)."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            return parts[2].strip("/")
    return ""


def _writable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f"probe-{os.getpid()}"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
        return True
    except OSError:
        return False


def detect(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None, has_devices: bool = False,
           node_id: str = "node") -> Support:
    """What this node can enforce, by trying (a directory is made and removed in each hierarchy)."""
    none = Support("none", "not enforced: no writable cgroup", "not enforced: no writable cgroup",
                   "not enforced: no writable cgroup")
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    controllers = root / "cgroup.controllers"
    if controllers.exists():
        names = set(controllers.read_text().split())
        base = root / "gpusched" / node_id
        if {"cpu", "memory"} <= names and _enable_v2(root, base) and _writable_dir(base):
            return Support("v2", "cgroup v2 cpu.max", "cgroup v2 memory.max",
                           "not enforced: cgroup v2 limits devices only through eBPF",
                           (("v2", base),))
        return none
    found = []
    for controller in ("cpu", "memory", "devices"):
        hierarchy = root / controller
        marker = {"cpu": "cpu.cfs_quota_us", "memory": "memory.limit_in_bytes", "devices": "devices.deny"}[controller]
        if not (hierarchy / marker).exists():
            continue
        base = hierarchy / _own_path(controller, proc_cgroup) / "gpusched" / node_id
        if _writable_dir(base):
            found.append((controller, base))
    have = {c for c, _ in found}
    if not have:
        return none
    devices = ("cgroup v1 devices.deny of other GPUs' device files" if has_devices else
               "not enforced: no NVIDIA device files on this node") if "devices" in have else \
        "not enforced: no writable devices cgroup"
    return Support("v1", "cgroup v1 cpu.cfs_quota_us" if "cpu" in have else "not enforced: no writable cpu cgroup",
                   "cgroup v1 memory.limit_in_bytes" if "memory" in have else
                   "not enforced: no writable memory cgroup", devices, tuple(found))


def _enable_v2(root: Path, base: Path) -> bool:
    """Delegate cpu and memory down to ``base`` (each level's subtree_control); False where refused."""
    try:
        level = root
        for part in (*base.relative_to(root).parts, None):  # down to base itself: its children are the jobs
            control = level / "cgroup.subtree_control"
            if not {"cpu", "memory"} <= set(control.read_text().split() if control.exists() else ()):
                control.write_text("+cpu +memory")
            if part is None:
                break
            level = level / part
            level.mkdir(exist_ok=True)
        return True
    except OSError as exc:
        log.info("cgroup v2 controllers cannot be delegated under %s: %s", root, exc)
        return False


NO_CGROUPS = Support("none", "not enforced", "not enforced", "not enforced")


class JobCgroups:
    """The cgroups of one node's jobs (nothing at all where the node supports none)."""

    def __init__(self, support: Support) -> None:
        self.support = support

    def _dirs(self, job_id: str) -> list[tuple[str, Path]]:
        return [(controller, base / job_id) for controller, base in self.support.hierarchies]

    def prepare(self, job_id: str, limits: Limits) -> list[str]:
        """Make the job's cgroups with its limits; what could not be done (the job runs regardless)."""
        problems = []
        for controller, path in self._dirs(job_id):
            try:
                path.mkdir(exist_ok=True)
                if controller == "v2":
                    if limits.cpu_quota_us is not None:
                        (path / "cpu.max").write_text(f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
                    if limits.memory_bytes is not None:
                        (path / "memory.max").write_text(str(limits.memory_bytes))
                        _try_write(path / "memory.swap.max", "0")
                elif controller == "cpu" and limits.cpu_quota_us is not None:
                    (path / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (path / "cpu.cfs_quota_us").write_text(str(limits.cpu_quota_us))
                elif controller == "memory" and limits.memory_bytes is not None:
                    (path / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
                    _try_write(path / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
                elif controller == "devices":
                    for minor in limits.denied_minors:
                        (path / "devices.deny").write_text(f"c {NVIDIA_MAJOR}:{minor} rwm")
            except OSError as exc:
                problems.append(f"{controller}: {exc.strerror or exc}")
        return problems

    def enter(self, job_id: str, pid: int) -> list[str]:
        """Move ``pid`` (the job's wrapper, not yet running the command) into the job's cgroups."""
        problems = []
        for controller, path in self._dirs(job_id):
            try:
                (path / "cgroup.procs").write_text(str(pid))
            except OSError as exc:
                problems.append(f"{controller}: {exc.strerror or exc}")
        return problems

    def remove(self, job_id: str) -> None:
        """Remove the job's cgroups once it ended (one still holding a process stays)."""
        for _, path in self._dirs(job_id):
            try:
                path.rmdir()
            except OSError:
                pass

    def sweep(self, keep: set[str]) -> int:
        """Remove the empty cgroups of jobs not in ``keep`` (jobs that ended while no agent watched them: a
        stack taken down, a node rebooted under an old agent directory); returns how many went. A kernel
        keeps every cgroup directory until it is removed, and refuses new ones past its limit (65,535 memory
        cgroups), so leftovers would in time cost every job on the node its limits."""
        removed = 0
        for _, base in self.support.hierarchies:
            try:
                children = [p for p in base.iterdir() if p.is_dir() and p.name not in keep]
            except OSError:
                continue
            for path in children:
                try:
                    path.rmdir()
                    removed += 1
                except OSError:
                    pass  # it still holds a process: not a leftover
        return removed

    def memory_limit(self, job_id: str) -> int | None:
        """The memory limit in force for the job (tests, `gpusched agent-check`)."""
        for controller, path in self._dirs(job_id):
            name = {"v2": "memory.max", "memory": "memory.limit_in_bytes"}.get(controller)
            if name and (path / name).exists():
                text = (path / name).read_text().strip()
                return None if text == "max" else int(text)
        return None


def _try_write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError:
        pass  # swap accounting is off on many kernels: the memory limit still holds
