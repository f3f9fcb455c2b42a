"""``gpusched chaos``: the fault campaign on a stack of its own (see the package's docstring).

Timeline: the stack comes up (private PostgreSQL, the broker, two replicas of admission, quota, placement and
preemption, one metrics service, the gateway, workload nodes and a probe node); the workload is submitted
through the gateway at a steady rate while the faults run one after another (each: a quiet gap, the fault,
its healing, then a probe job on the probe node, timed from the healing until it runs: the fault's
recovery); then every acknowledged job is waited for, and the checker reads the store and the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg
import yaml

from gpusched import Client as GatewayClient
from gpusched.config import read_config
from gpusched_common.infra import postgres
from gpusched_common.infra.processes import alive
from gpusched_common.stores.quota import reservations_held
from gpusched_cli import stack
from gpusched_cli.teardown import agents_dir

from gpusched_cli.chaos import collect, schedule as sch, workload as wl
from gpusched_cli.chaos.checker import Report, check, table
from gpusched_cli.chaos.faults import Injector, Processes

REPLICATED = ("admission", "quota", "placement", "preemption")
TERMINAL = ("Succeeded", "Failed", "Cancelled", "Rejected")
NODE_MODELS = ["H100-80GB", "H100-80GB", "H100-80GB", "A100-80GB+mig", "L4-24GB"]  # the last: the probe node
GPUS_PER_NODE = 8
LEASE_S, GRACE_S, SESSION_S = 8.0, 2.0, 6.0
# the workload's pace: what this stack sustains on a 2-core machine while it is being broken (faster, and
# the queues only grow: a backlog measures capacity, not recovery)
JOBS_PER_S = 2.0
JOB_ID = re.compile(r"j-[0-9a-f]{16}")
MAX_STORIES = 20  # jobs the checker named whose stories chaos.json keeps
MISSING_GRACE_S = 60.0  # the drain ends this long after the store's last job ended, even if some never came


@dataclass(frozen=True)
class Options:
    jobs: int = 2000
    faults: int = 40
    seed: int = 1
    broker: str = "tansu"
    drain_s: float = 600.0
    probe_timeout_s: float = 120.0
    kinds: tuple[str, ...] = sch.KINDS  # the fault kinds drawn from (a campaign on one kind: where it hurts)
    out: Path | None = Path("bench-results/chaos.json")


@dataclass
class Recovery:
    fault: int
    kind: str
    target: str
    done: str
    recovery_s: float | None  # None: the probe never ran within its timeout
    # where the probe's time went, seconds after the healing: accepted by the gateway, then each event of
    # its stream as the store recorded it, then its run's start
    stages: dict[str, float] = field(default_factory=dict)
    waited_for: list[str] = field(default_factory=list)  # the reasons of its last deferral, if it was deferred


class Campaign:
    def __init__(self, options: Options, home: Path, progress=print) -> None:
        self.o, self.home, self.progress = options, home, progress
        self.runs_dir = home / "runs"
        self.runjob = str(Path(__file__).with_name("runjob.py"))
        self.acknowledged: list[str] = []
        self.recoveries: list[Recovery] = []
        self.exercised: dict[str, int] = {}
        self.stories: dict[str, dict] = {}
        self.probes: set[str] = set()
        self._stages: dict[str, float] = {}  # the current probe's (Recovery.stages)
        self._waited_for: list[str] = []
        self.deaths: list[str] = []  # processes that died by themselves (supervise)
        self.nonce = uuid.uuid4().hex[:8]  # idempotency keys of this campaign only

    # --- the stack ----------------------------------------------------------------------------------

    async def start(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.runs_dir, 0o777)  # jobs may run as other users
        self.pg_root = self.home / "pg"
        self.pg = postgres.start_private(self.pg_root)
        self.tenancy = wl.tenancy(whole_gpus=3 * GPUS_PER_NODE, mig_gpus=GPUS_PER_NODE, probe_gpus=GPUS_PER_NODE)
        tenants_file = self.home / "tenants.yaml"
        tenants_file.write_text(yaml.safe_dump(self.tenancy, sort_keys=False))
        self._previous_home = os.environ.get("GPUSCHED_HOME")
        os.environ["GPUSCHED_HOME"] = str(self.home / "stack")
        env = {"GPUSCHED_TENANTS_FILE": str(tenants_file), "GPUSCHED_LEASE_TTL_S": str(LEASE_S),
               "GPUSCHED_FENCE_GRACE_S": str(GRACE_S), "GPUSCHED_HEARTBEAT_INTERVAL_S": "1",
               "GPUSCHED_KAFKA_SESSION_TIMEOUT_MS": str(int(SESSION_S * 1000)),
               "GPUSCHED_START_RESEND_S": "10", "GPUSCHED_PREEMPTION_GRACE_S": "2",
               "GPUSCHED_PREEMPTION_MIN_RUNTIME_S": "0.5", "GPUSCHED_TELEMETRY_INTERVAL_S": "2"}
        self.state = await stack.up(nodes=len(NODE_MODELS), gpu_models=NODE_MODELS, gpus_per_node=GPUS_PER_NODE,
                                    database_name=f"gpusched_chaos_{uuid.uuid4().hex[:8]}", broker=self.o.broker,
                                    pg_server=self.pg.server_url, extra_env=env, progress=self.progress)
        for name in REPLICATED:
            stack.start_service(self.state, f"{name}-2", f"services.{name}")
        stack.save(self.state)
        self.progress(f"replicas   {', '.join(f'{n}-2' for n in REPLICATED)} started")
        token = read_config(Path(self.state.config_path)).get("token") if self.state.config_path else None
        self.client = GatewayClient(self.state.gateway, token)
        self.procs = Processes(self.state)
        self.injector = Injector(self.procs, pg=self.pg, pg_root=self.pg_root,
                                 agents_dir=agents_dir(self.state.home, self.state.env),
                                 partitions=int(os.environ.get("GPUSCHED_KAFKA_PARTITIONS", "6")))

    def stop(self) -> None:
        if getattr(self, "state", None) is not None or (self.home / "stack" / "stack.json").exists():
            stack.down(progress=lambda line: None)
        if getattr(self, "pg", None) is not None:
            postgres.stop_private(self.pg)
            if getattr(self, "finding", False):  # a broken invariant: the store stays for a look
                self.progress(f"kept       the campaign's database (a finding): {self.pg.data_dir}, database "
                              f"{self.state.database_url.rsplit('/', 1)[-1]}")
            else:
                shutil.rmtree(self.pg.data_dir, ignore_errors=True)  # the campaign's own server: nothing to keep
        previous = getattr(self, "_previous_home", None)
        if previous is None:
            os.environ.pop("GPUSCHED_HOME", None)
        else:
            os.environ["GPUSCHED_HOME"] = previous

    def targets(self) -> sch.Targets:
        services = tuple(n for n in self.procs.names() if not n.startswith("agent-"))
        agents = tuple(f"agent-{n}" for n in self.state.node_ids[:-1])  # never the probe node
        return sch.Targets(services=services, replicas=tuple(f"{n}-2" for n in REPLICATED),
                           consumers=tuple(n for n in services if n.split("-")[0] in REPLICATED),
                           relays=("placement", "quota", "admission", "preemption"), agents=agents)

    # --- workload and probes --------------------------------------------------------------------------

    async def submit(self, planned: list[wl.Planned], span_s: float) -> None:
        """Submit in batches at a steady rate over ``span_s``; a batch the gateway does not answer (it or
        the broker is down) is sent again with the same idempotency key until it is accepted."""
        batch = 10
        started = time.monotonic()
        for first in range(0, len(planned), batch):
            chunk = planned[first:first + batch]
            key = f"chaos-{self.o.seed}-{first}-{self.nonce}"
            ids = await self._until_accepted(key, [p.spec.model_dump(mode="json", exclude_defaults=True)
                                                   | {"tenant": p.spec.tenant} for p in chunk])
            self.acknowledged.extend(ids)
            for job_id, p in zip(ids, chunk, strict=True):
                if p.cancel_after_s is not None:
                    asyncio.get_running_loop().call_later(p.cancel_after_s, self._cancel_later, job_id)
            delay = started + (first + batch) / len(planned) * span_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _until_accepted(self, key: str, specs: list[dict]) -> list[str]:
        while True:
            try:
                outcome = await asyncio.to_thread(self.client.submit_batch, specs, idempotency_key=key)
                ids = [r["job_id"] for r in outcome["results"] if "job_id" in r]
                if len(ids) == len(specs):
                    return ids
                self.progress(f"  refused: {[r for r in outcome['results'] if 'job_id' not in r][:1]}")
                return ids
            except Exception:  # noqa: BLE001 - the gateway or the broker is down: again
                await asyncio.sleep(1.0)

    def _cancel_later(self, job_id: str) -> None:
        async def cancel() -> None:
            for _ in range(30):
                try:
                    await asyncio.to_thread(self.client.cancel, job_id, "chaos: cancelled on purpose")
                    return
                except Exception:  # noqa: BLE001 - the gateway or the broker is down: again
                    await asyncio.sleep(1.0)

        asyncio.get_running_loop().create_task(cancel())

    async def probe(self, n: int, healed_at: float) -> float | None:
        spec = wl.probe_spec(sys.executable, self.runjob, str(self.runs_dir), n)
        async with asyncio.timeout(self.o.probe_timeout_s):  # not wait_for: see gpusched_common.relay's _pump
            job_ids = await self._until_accepted(f"probe-{self.o.seed}-{n}-{self.nonce}", [
                spec.model_dump(mode="json", exclude_defaults=True) | {"tenant": spec.tenant}])
        self.probes.update(job_ids)
        self._stages = {"accepted": round(time.time() - healed_at, 2)}
        deadline = time.monotonic() + self.o.probe_timeout_s
        try:
            while time.monotonic() < deadline:  # its run's own record says when it started (whatever was reported)
                for run in self.runs_dir.glob(f"{job_ids[0]}.*"):
                    try:
                        started = float(run.read_text().split(" ")[5])
                    except (OSError, IndexError, ValueError):
                        continue  # being written
                    self._stages["started"] = round(started - healed_at, 2)
                    return round(max(0.0, started - healed_at), 3)
                await asyncio.sleep(0.2)
            return None
        finally:
            await self._probe_story(job_ids[0], healed_at)

    async def _probe_story(self, job_id: str, healed_at: float) -> None:
        """When the store recorded each of the probe's events (a slow recovery says which step waited)."""
        try:
            conn = await asyncpg.connect(self.state.database_url, timeout=5)
            try:
                rows = await conn.fetch("SELECT type, extract(epoch FROM recorded_at) AS at, payload->'reasons' AS why"
                                        " FROM events WHERE stream_id = $1 ORDER BY version", f"job-{job_id}")
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError, asyncio.TimeoutError):
            return  # the store is down (a fault): the recovery itself is still measured
        for row in rows:
            self._stages.setdefault(row["type"], round(float(row["at"]) - healed_at, 2))
            if row["why"] is not None:
                self._waited_for = [str(r) for r in json.loads(row["why"])][:5]

    # --- the campaign --------------------------------------------------------------------------------

    def supervise(self) -> None:
        """Start again any process that died by itself (as a supervisor would), and count it: a service
        should outlive every fault, not exit on one."""
        for name, pid in list(self.state.processes.items()):
            if not alive(pid) and name in self.procs.known():
                self.deaths.append(name)
                self.progress(f"  {name} (pid {pid}) died by itself: started again")
                self.procs.start(name)

    async def faults(self, faults: tuple[sch.Fault, ...], spread_s: float = 0.0) -> None:
        """One after another, each after its gap (and ``spread_s`` more: the faults span the workload)."""
        for name in self.procs.names():
            self.procs.remember(name)  # how each was started, to start it again
        for fault in faults:
            await asyncio.sleep(fault.gap_s + spread_s)
            self.supervise()
            done = await self.injector.run(fault)
            healed_at = time.time()
            self._stages, self._waited_for = {}, []
            recovery = None if done.startswith("skipped") else await self.probe(fault.index, healed_at)
            self.recoveries.append(Recovery(fault.index, fault.kind, fault.target, done, recovery, self._stages,
                                            self._waited_for))
            shown = "never" if recovery is None else f"{recovery:.1f} s"
            self.progress(f"  fault {fault.index + 1:>2}/{len(faults)} {fault.kind:<17} {fault.target:<14} "
                          f"recovered in {shown:>7}  ({done})")
            if recovery is None or recovery > LEASE_S + 5:
                self.progress("      the probe: " + ", ".join(f"{k} +{v:g}" for k, v in self._stages.items())
                              + (f"; waited for: {'; '.join(self._waited_for)}" if self._waited_for else ""))

    async def drain(self) -> dict[str, int]:
        conn = await asyncpg.connect(self.state.database_url)
        deadline = time.monotonic() + self.o.drain_s
        settled_since: float | None = None
        try:
            while True:
                try:
                    rows = await conn.fetch("SELECT status, count(*) AS n FROM jobs WHERE job_id = ANY($1::text[])"
                                            " GROUP BY status", self.acknowledged)
                except (OSError, asyncpg.PostgresError):
                    conn = await asyncpg.connect(self.state.database_url)
                    continue
                counts = {r["status"]: r["n"] for r in rows}
                ended, present = sum(counts.get(s, 0) for s in TERMINAL), sum(counts.values())
                if ended >= len(self.acknowledged) or time.monotonic() > deadline:
                    return counts
                # every job the store has ended, and the rest have not appeared for a while: they are lost
                # (the checker says so), and waiting on would only wait
                settled_since = settled_since if ended == present else None
                settled_since = settled_since or (time.monotonic() if ended == present else None)
                if settled_since is not None and time.monotonic() - settled_since > MISSING_GRACE_S:
                    return counts
                await asyncio.sleep(1.0)
        finally:
            await conn.close()

    async def quota_settled(self, timeout_s: float = 60.0) -> None:
        """Wait until quota gave back the ended jobs' reservations (it does so as it reads their ends, a
        little after the store records them), or the timeout: what is still held then is a finding."""
        conn = await asyncpg.connect(self.state.database_url)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and await reservations_held(conn, list(wl.TENANTS)):
                await asyncio.sleep(0.5)
        finally:
            await conn.close()

    async def run(self) -> Report:
        await self.start()
        faults = sch.make_schedule(self.o.seed, self.o.faults, self.targets(), sch.Timing(LEASE_S, GRACE_S, SESSION_S),
                                   kinds=self.o.kinds)
        planned = wl.plan(self.o.seed, self.o.jobs, python=sys.executable, runjob=self.runjob, runs_dir=str(self.runs_dir))
        fault_span = sum(f.gap_s + f.duration_s + 4.0 for f in faults)
        span = max(30.0, fault_span, len(planned) / JOBS_PER_S)
        self.progress(f"campaign   {len(planned)} jobs over ~{span:.0f} s, {len(faults)} faults, seed {self.o.seed}")
        submitter = asyncio.create_task(self.submit(planned, span))
        await self.faults(faults, spread_s=(span - fault_span) / max(1, len(faults)))
        await submitter
        self.supervise()
        self.progress(f"draining   {len(self.acknowledged)} acknowledged jobs")
        counts = await self.drain()
        self.progress(f"           {', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}")
        await self.quota_settled()
        await asyncio.sleep(3.0)  # the last runs' files settle; the relays publish what is left
        store = await collect.read_store(self.state.database_url, self.acknowledged)
        facts = store.facts
        runs = [r for r in collect.read_runs(self.runs_dir) if r.job_id not in self.probes]  # the probes' node
        expected = {j: p.expected_exit for j, p in zip(self.acknowledged, planned, strict=False)}
        unexpected = [f"{j}: Failed (exit {f.end_exit_code})" for j, f in facts.items()
                      if f.status == "Failed" and expected.get(j) == 0]
        self.exercised = await collect.exercised(self.state.database_url, self.acknowledged)
        self.exercised["runs"] = len(runs)
        self.exercised["process_deaths"] = len(self.deaths)
        report = check(seed=self.o.seed, acknowledged=self.acknowledged, facts=facts, runs=runs, quota=store.quota,
                       limits=collect.quota_limits(self.tenancy), unpublished=store.unpublished,
                       usage_at_end=[u for u in store.usage_at_end if u[0] in wl.TENANTS],  # probes may run
                       faults=[r.kind for r in self.recoveries if not r.done.startswith("skipped")],
                       recoveries=[r.recovery_s if r.recovery_s is not None else self.o.probe_timeout_s
                                   for r in self.recoveries if not r.done.startswith("skipped")],
                       unexpected_failures=unexpected)
        named = sorted({m for items in report.examples.values() for item in items for m in JOB_ID.findall(item)})
        self.stories = await collect.stories(self.state.database_url, named[:MAX_STORIES], runs)
        self.finding = not report.clean
        return report


async def run_campaign(options: Options, home: Path, progress=print) -> tuple[Report, Campaign]:
    campaign = Campaign(options, home, progress)
    try:
        report = await campaign.run()
    finally:
        try:
            campaign.stop()
        except Exception as exc:  # noqa: BLE001 - a stack half up: say so, do not hide the campaign's error
            progress(f"stopping the campaign's stack: {exc}")
    if options.out is not None:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps({**{k: v for k, v in asdict(report).items() if k != "examples"},
                                           "examples": report.examples,
                                           "exercised": campaign.exercised,
                                           "stories": campaign.stories,
                                           "recoveries": [asdict(r) for r in campaign.recoveries]}, indent=2) + "\n")
    return report, campaign


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM (a CI timeout) stops the campaign's stack as Ctrl-C does


def main(options: Options, *, as_json: bool = False) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    home = Path(os.environ.get("GPUSCHED_CHAOS_HOME", ".gpusched/chaos")).resolve() / f"seed-{options.seed}-{random.randrange(1 << 30):x}"
    home.mkdir(parents=True, exist_ok=True)
    def show(line: str) -> None:
        print(line, flush=True)

    report, campaign = asyncio.run(run_campaign(options, home, progress=(lambda line: None) if as_json else show))
    if as_json:
        print(json.dumps({**asdict(report), "exercised": campaign.exercised}, indent=2))
    else:
        print(table(report, campaign.recoveries, LEASE_S + 5, campaign.exercised))
    return 0 if report.clean and not campaign.deaths else 1


def add_chaos_parser(sub) -> None:
    p = sub.add_parser("chaos", help="the fault campaign: a stack of its own, a seeded workload and faults, "
                                     "then the system's invariants checked (bench-results/chaos.json)")
    p.add_argument("--jobs", type=int, default=2000, help="workload jobs (default 2000)")
    p.add_argument("--faults", type=int, default=40, help="faults injected, one of each kind first (default 40)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--broker", choices=["tansu", "kafka"], default="tansu",
                   help="tansu loses its data when killed; Apache Kafka keeps it")
    p.add_argument("--kinds", type=_kinds, default=sch.KINDS,
                   help=f"comma-separated fault kinds to draw from (default all: {','.join(sch.KINDS)})")
    p.add_argument("--drain-s", type=float, default=600.0, help="how long to wait for the jobs at the end")
    p.add_argument("--out", type=Path, default=Path("bench-results/chaos.json"))
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=lambda a: main(Options(jobs=a.jobs, faults=a.faults, seed=a.seed, broker=a.broker,
                                               drain_s=a.drain_s, out=a.out, kinds=a.kinds), as_json=a.json))


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in sch.KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kind(s) {unknown}: choose from {', '.join(sch.KINDS)}")
    return kinds
