"""Injecting and healing the campaign's faults on the running stack (the shell of ``schedule``).

Processes are restarted as they were started: their command line and environment are read from
``/proc`` before they are killed, so a gateway keeps its port and an agent its node. Every process
touched is one the stack started (by its pid in ``stack.json``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from gpusched_common.infra import postgres
from gpusched_common.infra.brokers import restart_broker
from gpusched_common.infra.processes import alive, spawn
from gpusched_common.kafka_admin import create_topics
from gpusched_cli import stack

from gpusched_cli.chaos import schedule as sch

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = "+20s"  # how far ahead a skewed replica's clock runs
IDENTITY_FILES = ("node.key", "node.enrolled")  # a reimaged node keeps its identity (an operator would re-enrol)


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]


class Processes:
    """The stack's processes by name: kill, pause, resume and start again as they were."""

    def __init__(self, state: stack.StackState) -> None:
        self.state = state
        self._launch: dict[str, Launch] = {}

    def pid(self, name: str) -> int:
        return self.state.processes[name]

    def remember(self, name: str) -> Launch:
        pid = self.pid(name)
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        env = dict(item.decode().split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                   if b"=" in item)
        self._launch[name] = Launch(argv, env)
        return self._launch[name]

    def kill(self, name: str) -> None:
        self.remember(name)
        _signal(self.pid(name), signal.SIGKILL)

    def pause(self, name: str) -> None:
        _signal(self.pid(name), signal.SIGSTOP)

    def resume(self, name: str) -> None:
        _signal(self.pid(name), signal.SIGCONT)

    def start(self, name: str, env_changes: dict[str, str | None] | None = None) -> int:
        launch = self._launch[name]
        env = dict(launch.env)
        for key, value in (env_changes or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        pid = spawn(name, launch.argv, Path(self.state.home) / "logs", env)
        self.state.processes[name] = pid
        stack.save(self.state)
        return pid

    def known(self) -> set[str]:
        """The processes whose start is remembered (``remember``)."""
        return set(self._launch)

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self.state.processes if n.startswith(prefix))


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


async def relay_holder(database_url: str, producer: str) -> int | None:
    """The pid of the process holding ``producer``'s outbox relay now (its term's holder, host:pid)."""
    conn = await asyncpg.connect(database_url)
    try:
        holder = await conn.fetchval("SELECT holder FROM relay_terms WHERE producer = $1", producer)
    finally:
        await conn.close()
    try:
        return int(str(holder).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def skew_supported() -> str | None:
    """Why clock skew cannot be injected here (None: it can)."""
    return None if FAKETIME_LIB.exists() else f"libfaketime is not installed ({FAKETIME_LIB} missing)"


class Injector:
    def __init__(self, procs: Processes, *, pg: postgres.PrivatePostgres, pg_root: Path, agents_dir: Path,
                 partitions: int) -> None:
        self.procs, self.pg, self.pg_root, self.agents_dir, self.partitions = procs, pg, pg_root, agents_dir, partitions

    async def run(self, fault: sch.Fault) -> str:
        """Inject ``fault``, hold it for its duration, heal it; what was done, in words."""
        kind, target, procs = fault.kind, fault.target, self.procs
        if kind == sch.KILL_SERVICE:
            procs.kill(target)
            await asyncio.sleep(fault.duration_s)
            procs.start(target)
            return f"SIGKILL {target}, started again after {fault.duration_s:.1f} s"
        if kind == sch.KILL_RELAY:
            pid = await relay_holder(self.procs.state.database_url, target)
            name = next((n for n, p in procs.state.processes.items() if p == pid), None)
            if name is None:
                return f"no live holder of {target}'s relay (pid {pid}): nothing killed"
            procs.kill(name)
            await asyncio.sleep(fault.duration_s)
            procs.start(name)
            return f"SIGKILL {name}, the holder of {target}'s relay, started again"
        if kind in (sch.PAUSE_SERVICE, sch.PAUSE_AGENT, sch.CONSUMER_STALL):
            procs.pause(target)
            await asyncio.sleep(fault.duration_s)
            procs.resume(target)
            return f"SIGSTOP {target} for {fault.duration_s:.1f} s, then SIGCONT"
        if kind == sch.PG_RESTART:
            postgres.stop_private(self.pg, mode="immediate")
            await asyncio.sleep(fault.duration_s)
            await asyncio.to_thread(postgres.start_private, self.pg_root, port=self.pg.port)
            return f"PostgreSQL stopped (immediate) for {fault.duration_s:.1f} s, started again"
        if kind == sch.BROKER_RESTART:
            return await self._broker(fault)
        if kind == sch.AGENT_WIPE:
            return await self._wipe(fault)
        if kind == sch.AGENT_FEWER_GPUS:
            launch = procs.remember(target)
            spec = launch.env.get("GPUSCHED_SIMULATED_GPUS", "")
            model, count, *rest = spec.split(":")
            fewer = ":".join([model, str(max(1, int(count) - 2)), *rest])
            procs.kill(target)
            procs.start(target, {"GPUSCHED_SIMULATED_GPUS": fewer})
            await asyncio.sleep(fault.duration_s)
            procs.kill(target)
            procs.start(target, {"GPUSCHED_SIMULATED_GPUS": spec})
            return f"{target} back with {fewer} for {fault.duration_s:.1f} s, then with {spec}"
        if kind == sch.CLOCK_SKEW:
            why = skew_supported()
            if why is not None:
                return f"skipped: {why}"
            procs.kill(target)
            procs.start(target, {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": SKEW})
            await asyncio.sleep(fault.duration_s)
            procs.kill(target)
            procs.start(target, {"LD_PRELOAD": None, "FAKETIME": None})
            return f"{target} ran {SKEW} ahead for {fault.duration_s:.1f} s, then set right"
        raise ValueError(f"unknown fault kind {kind}")

    async def _broker(self, fault: sch.Fault) -> str:
        state = self.procs.state
        broker = state.running_broker
        assert broker is not None
        os.kill(broker.pid, signal.SIGKILL)
        await asyncio.sleep(fault.duration_s)
        broker = await asyncio.to_thread(restart_broker, broker)
        state.broker = broker.to_json()
        stack.save(state)
        if not broker.keeps_data_across_restart:
            await create_topics(broker.bootstrap, self.partitions)  # Tansu keeps nothing: the operator's step
            return f"{broker.kind} killed, down {fault.duration_s:.1f} s, started again empty (topics recreated)"
        return f"{broker.kind} killed, down {fault.duration_s:.1f} s, started again on its data"

    async def _wipe(self, fault: sch.Fault) -> str:
        """A node reimaged: its agent and every job it ran killed, its directory emptied but for its identity."""
        procs, target = self.procs, fault.target
        node_dir = self.agents_dir / procs.remember(target).env.get("GPUSCHED_NODE_ID", "")
        procs.kill(target)
        killed = 0
        try:  # its watchdog too: a reimage leaves nothing of the node's last life running
            _signal(int((node_dir / "watchdog.pid").read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
        for record in stack_records(node_dir):
            if alive(record.pid):
                _killpg(record.pid)
                killed += 1
        for path in node_dir.iterdir() if node_dir.is_dir() else []:
            if path.name in IDENTITY_FILES:
                continue
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        await asyncio.sleep(fault.duration_s)
        procs.start(target)
        return f"{target} reimaged: agent and {killed} job(s) killed, work directory wiped, started again"


def stack_records(node_dir: Path) -> list:
    from gpusched_common.job_records import read_records

    return read_records(node_dir, lambda path, exc: None) if node_dir.is_dir() else []


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
