"""The local stack without Docker: a broker (Tansu, or Apache Kafka), PostgreSQL and every service as its
own process.

State lives in a project data directory (GPUSCHED_HOME, default `.gpusched/`): `stack.json` names every
process started, so `down` stops exactly those, by PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import asyncpg
import httpx
import yaml

from gpusched import config as client_config
from gpusched.config import write_config
from gpusched_common import db_roles, node_keys, producers, tokens
from gpusched_common.files import write_private
from gpusched_common.credentials import TenantKey, new_secret, write_keys
from gpusched_common.identity import OPERATOR
from gpusched_common.db import drop_database, ensure_database, migrate
from gpusched_common.infra import postgres
from gpusched_common.infra.brokers import BrokerKind, RunningBroker, start_broker, stop_broker
from gpusched_common.infra.processes import free_port, spawn, stop_pid
from gpusched_common.kafka_admin import create_topics
from gpusched_common.settings import Settings
from gpusched_common.stores import cluster
from gpusched_common import senders

from gpusched_cli.stack_nodes import capacity_specs, fleet_specs, node_specs  # noqa: F401 - node_specs: re-exported
from gpusched_cli.teardown import stop_stack_jobs

SERVICES = ("admission", "quota", "placement", "preemption", "metrics")


@dataclass
class StackState:
    home: str
    kafka_bootstrap: str
    database_url: str
    owns_database: bool
    broker: dict | None = None  # RunningBroker.to_json()
    private_pg: dict | None = None  # PrivatePostgres.to_json(), when the stack started its own server
    processes: dict[str, int] = field(default_factory=dict)  # name -> pid
    node_ids: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # GPUSCHED_* settings every process was started with
    gateway: str | None = None  # the gateway's URL
    config_path: str | None = None  # the client config `up` wrote (server and an operator token)

    @property
    def running_broker(self) -> RunningBroker | None:
        return RunningBroker.from_json(self.broker) if self.broker else None


def home_dir() -> Path:
    return Path(os.environ.get("GPUSCHED_HOME", ".gpusched")).resolve()


async def prepare_database(home: Path, database_name: str, fresh: bool, pg_server: str | None = None,
                           ) -> tuple[str, bool, postgres.PrivatePostgres | None]:
    """(database url, whether this stack owns it, the private server it started). In order: the database
    of GPUSCHED_DATABASE_URL as it is; a database on `pg_server`, else on a server at 127.0.0.1:5432, else
    on a private server in the stack's home (infra/postgres.py)."""
    explicit = os.environ.get("GPUSCHED_DATABASE_URL")
    if explicit:
        try:
            await ensure_database(explicit)
        except (OSError, asyncpg.PostgresError) as exc:
            raise RuntimeError(f"cannot use the database of GPUSCHED_DATABASE_URL: {exc}") from exc
        return explicit, False, None
    private = None
    server = pg_server or postgres.LOCAL_SERVER
    if not await postgres.server_reachable(server):
        if pg_server:
            raise RuntimeError(f"no PostgreSQL answers at {pg_server}")
        private = postgres.start_private(home / "pgdata")
        server = private.server_url
    url = f"{server}/{database_name}"
    if fresh:
        await drop_database(url)  # the broker keeps nothing across restarts; neither does our own database
    await ensure_database(url)
    return url, True, private


def service_env(state: StackState, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"GPUSCHED_DATABASE_URL": state.database_url, "GPUSCHED_KAFKA_BOOTSTRAP": state.kafka_bootstrap,
                "GPUSCHED_KAFKA_IDEMPOTENCE": str(_idempotence(state)).lower(), "PYTHONUNBUFFERED": "1"})
    env.setdefault("GPUSCHED_KAFKA_SESSION_TIMEOUT_MS", "3000")
    broker = state.running_broker
    if broker is not None and broker.kind == "tansu":  # Tansu answers a waiting fetch only at its end (settings.py)
        env.setdefault("GPUSCHED_KAFKA_FETCH_MAX_WAIT_MS", "50")
        env.setdefault("GPUSCHED_KAFKA_UNTAKEN_HOLD_MS", "100")  # aiokafka's own: fetch ahead (settings.py)
    env.update(extra or {})
    return env


def _idempotence(state: StackState) -> bool:
    broker = state.running_broker
    return broker.idempotence if broker else False


def start_service(state: StackState, name: str, module: str, extra_env: dict[str, str] | None = None) -> int:
    pid = spawn(name, [sys.executable, "-m", module], Path(state.home) / "logs",
                service_env(state, {**state.env, **(extra_env or {})}))
    state.processes[name] = pid
    return pid


async def up(*, nodes: int, gpu_models: list[str], gpus_per_node: int, database_name: str = "gpusched_local",
             fresh: bool = True, extra_env: dict[str, str] | None = None, broker: BrokerKind = "tansu",
             pg_server: str | None = None, fleet: int = 0, fleet_processes: int = 1, progress=print) -> StackState:
    """Start the stack on `broker` (Tansu by default); `pg_server`: a PostgreSQL server to create the
    stack's database in (see prepare_database); `fleet`: that many more simulated nodes, run by
    `fleet_processes` agent processes (a fleet each; hundreds of nodes per process). When a step fails,
    what was started is stopped again."""
    home = home_dir()
    if (home / "stack.json").exists():
        raise RuntimeError(f"a stack is already up ({home / 'stack.json'}); run `gpusched down` first")
    (home / "logs").mkdir(parents=True, exist_ok=True)
    try:
        return await _start(home, nodes=nodes, gpu_models=gpu_models, gpus_per_node=gpus_per_node,
                            database_name=database_name, fresh=fresh, extra_env=extra_env, broker=broker,
                            pg_server=pg_server, fleet=fleet, fleet_processes=fleet_processes, progress=progress)
    except BaseException:
        down(progress=lambda line: None)
        raise


async def _start(home: Path, *, nodes: int, gpu_models: list[str], gpus_per_node: int, database_name: str,
                 fresh: bool, extra_env: dict[str, str] | None, broker: BrokerKind, pg_server: str | None,
                 fleet: int, fleet_processes: int, progress) -> StackState:
    running = start_broker(broker, home / "broker")
    bootstrap = running.bootstrap
    state = StackState(home=str(home), kafka_bootstrap=bootstrap, database_url="", owns_database=False,
                       broker=running.to_json())
    save(state)  # from here on, `down` stops what was started even if the rest fails
    progress(f"broker     {running.label()} on {bootstrap} (pid {running.pid})")
    url, owns, private = await prepare_database(home, database_name, fresh, pg_server)
    state.database_url, state.owns_database = url, owns
    state.private_pg = private.to_json() if private else None
    save(state)
    progress(f"database   {url}" + (f" (private PostgreSQL {private.version})" if private else ""))
    applied = await migrate(url)
    progress(f"schema     {len(applied)} migration(s) applied")
    partitions = int(os.environ.get("GPUSCHED_KAFKA_PARTITIONS", "6"))
    await create_topics(bootstrap, partitions)
    progress(f"topics     created with {partitions} partitions")
    if fresh:
        # the agents' keys and enrolments belong to the database just dropped: kept, the nodes would sign
        # with keys the new store never enrolled and placement would refuse every report they send
        shutil.rmtree(home / "agents", ignore_errors=True)
    metrics_port = free_port()
    keys_dir = home / "service-keys"  # the signing services' keys: agents run only what placement/preemption sign
    command_keys = senders.provision_service_keys(keys_dir)
    join_token = await make_join_token(url, home / "join-token")  # each agent enrols its own node key with it
    env = {"GPUSCHED_AGENT_WORK_DIR": str(home / "agents"), "GPUSCHED_METRICS_PORT": str(metrics_port),
           "GPUSCHED_SERVICE_KEYS_DIR": str(keys_dir), "GPUSCHED_AGENT_JOIN_TOKEN_FILE": str(join_token),
           "GPUSCHED_AGENT_COMMAND_KEYS": command_keys,
           "GPUSCHED_TENANT_KEYS_FILE": str(make_local_keys(home)), **(extra_env or {})}
    if "GPUSCHED_TENANTS_FILE" not in env and "GPUSCHED_TENANTS_FILE" not in os.environ:
        env["GPUSCHED_TENANTS_FILE"] = str(make_local_tenancy(
            home, capacity_specs(nodes, gpu_models, gpus_per_node, fleet, fleet_processes)))
    state.env = env
    await start_gateway(state)  # first: the agents are given its public key (they serve it the jobs' logs)
    progress(f"gateway    {state.gateway} (server and an operator token in {state.config_path})")
    for name in SERVICES:
        start_service(state, name, f"services.{name}")
    for node_id, spec in node_specs(nodes, gpu_models, gpus_per_node):
        start_service(state, f"agent-{node_id}", "services.node_agent",
                      {"GPUSCHED_NODE_ID": node_id, "GPUSCHED_SIMULATED_GPUS": spec})
        state.node_ids.append(node_id)
    fleets = fleet_specs(fleet, fleet_processes, gpu_models, gpus_per_node) if fleet else []
    for prefix, count, spec in fleets:
        start_service(state, f"agent-{prefix}", "services.node_agent",
                      {"GPUSCHED_NODE_ID": prefix, "GPUSCHED_SIMULATED_GPUS": spec,
                       "GPUSCHED_SIMULATED_NODES": str(count)})
    save(state)
    fleet_note = f" and {fleet} simulated node(s) in {len(fleets)} fleet process(es)" if fleets else ""
    progress(f"services   {', '.join(SERVICES)} and {nodes} node agent(s){fleet_note} started")
    progress(f"metrics    http://127.0.0.1:{env['GPUSCHED_METRICS_PORT']}/metrics (Prometheus)")
    total = nodes + sum(count for _, count, _ in fleets)
    await wait_for_nodes(url, total, timeout_s=max(60.0, total * 0.2), progress=progress)
    progress(f"ready      {total} node(s) registered")
    return state


async def make_join_token(database_url: str, path: Path) -> Path:
    """A join token for the stack's agents (valid a week; a node enrolled keeps its key after), in a file of
    mode 0600 beside the stack's other secrets."""
    conn = await asyncpg.connect(database_url)
    try:
        text, _ = await node_keys.create_token(conn, description="gpusched up: the local stack's agents",
                                               ttl=timedelta(days=7), created_by="gpusched up",
                                               now=datetime.now(timezone.utc))
    finally:
        await conn.close()
    write_private(path, text + "\n")
    return path


async def start_gateway(state: StackState, timeout_s: float = 60.0) -> None:
    """The gateway as its own process: its producer key and database role provisioned as `gpusched
    gateway-init` does in production, an operator token issued, and both written to the client config
    (``gpusched.config``) so that the CLI reaches this stack."""
    home, now = Path(state.home), datetime.now(timezone.utc)
    key_file, password = home / "gateway-producer.key", db_roles.new_password()
    conn = await asyncpg.connect(state.database_url)
    try:
        async with conn.transaction():
            key = await producers.ensure(conn, key_file, name="gateway", tenants=(OPERATOR,), attests=True,
                                         created_by="gpusched up", now=now)
            await db_roles.enable_login(conn, db_roles.GATEWAY_ROLE, password)
            token, _ = await tokens.issue(conn, role="operator", tenant=None, name="local-operator", expires_at=None,
                                          created_by="gpusched up", now=now)
    finally:
        await conn.close()
    port = free_port()
    start_service(state, "gateway", "services.gateway", {
        "GPUSCHED_GATEWAY_PORT": str(port), "GPUSCHED_GATEWAY_PRODUCER_KEY_FILE": str(key_file),
        "GPUSCHED_GATEWAY_DATABASE_URL": db_roles.role_url(state.database_url, db_roles.GATEWAY_ROLE, password)})
    state.gateway = f"http://127.0.0.1:{port}"
    state.env["GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY"] = key.public_key_text()  # the agents' log servers know it
    state.config_path = str(write_config(state.gateway, token))
    save(state)
    await wait_until_ready(state.gateway, timeout_s)


async def wait_until_ready(server: str, timeout_s: float) -> None:
    deadline, last = time.monotonic() + timeout_s, "no answer"
    async with httpx.AsyncClient(timeout=2.0) as client:
        while time.monotonic() < deadline:
            try:
                response = await client.get(f"{server}/readyz")
                if response.status_code == 200:
                    return
                last = response.json().get("detail", response.text)
            except (httpx.HTTPError, ValueError) as exc:
                last = type(exc).__name__
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the gateway at {server} was not ready within {timeout_s}s ({last}); see .gpusched/logs")


LOCAL_TENANTS = ("research", "inference", "platform", "ml-eval")
# Each local team's nominal quota of every GPU model, as a share of the GPUs of that model; `guests` is
# charged for any tenant not named here (the operator key may submit for anyone). The shares add up to
# twice the cluster, like entitlements on a cluster that scales out: work beyond the nodes reserves quota
# and waits for capacity (where the scaler sees it). Platform may hold at most half of a model; the
# others borrow whatever the cohort leaves idle.
LOCAL_QUOTA_SHARES = {"research": 0.5, "inference": 0.5, "platform": 0.25, "ml-eval": 0.25, "guests": 0.5}
LOCAL_PRIORITY_CLASSES = {"urgent": 100, "high": 50, "normal": 10, "batch": 0}


def local_tenancy(specs: list[tuple[str, str]]) -> dict:
    """The local stack's tenancy (see deploy/tenants.example.yaml): one cohort `local` whose teams share
    the cluster, every model's nominal quota split by LOCAL_QUOTA_SHARES of the GPUs the nodes have."""
    capacity: dict[str, int] = {}
    for _, spec in specs:
        model, count = spec.split(":")[:2]
        capacity[model] = capacity.get(model, 0) + int(count)

    def team(name: str) -> dict:
        quota = {}
        for model, gpus in capacity.items():
            nominal = round(gpus * LOCAL_QUOTA_SHARES[name], 3)
            quota[model] = {"nominal": nominal}
            if name == "platform":
                quota[model]["borrowing_limit"] = round(gpus / 2 - nominal, 3)
        return {"name": name, "quota": quota}

    return {"version": 1, "revision": 1, "flavors": list(capacity),
            "priority_classes": LOCAL_PRIORITY_CLASSES, "default_priority_class": "batch",
            "fair_share": {"half_life_s": 3600}, "guest_tenant": "guests",
            "tenants": [{"name": "local", "children": [team(name) for name in LOCAL_QUOTA_SHARES]}]}


def make_local_tenancy(home: Path, specs: list[tuple[str, str]]) -> Path:
    """Write the local tenancy into the stack's home; `gpusched tenants apply` changes it at run time."""
    path = home / "tenants.yaml"
    header = "# The local stack's tenancy, written by `gpusched up` for its nodes (libs/cli/gpusched_cli/stack.py).\n"
    path.write_text(header + yaml.safe_dump(local_tenancy(specs), sort_keys=False))
    return path


def make_local_keys(home: Path) -> Path:
    """Fresh credentials for the local stack: one key per demo tenant and one operator key ("*") that
    the CLI uses for any other tenant. Production keys come from the operator (deploy/)."""
    path = home / "tenant-keys.yaml"
    keys = [TenantKey(f"{t}-local", t, new_secret().encode()) for t in LOCAL_TENANTS]
    keys.append(TenantKey("operator-local", OPERATOR, new_secret().encode()))
    write_keys(path, keys)
    return path


async def wait_for_nodes(database_url: str, count: int, timeout_s: float = 60.0, progress=None) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout_s
        shown = time.monotonic()
        while time.monotonic() < deadline:
            registered = (await cluster.counts(conn))[0]
            if registered >= count:
                return
            if progress is not None and count > 50 and time.monotonic() - shown >= 5.0:
                progress(f"           {registered}/{count} node(s) registered ...")
                shown = time.monotonic()
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{count} node(s) did not register within {timeout_s}s; see the logs in .gpusched/logs")
    finally:
        await conn.close()


def client_settings(state: StackState) -> Settings:
    """Settings for a client of this stack: where it is, and the credentials to sign with."""
    keys = state.env.get("GPUSCHED_TENANT_KEYS_FILE")
    return Settings(database_url=state.database_url, kafka_bootstrap=state.kafka_bootstrap,
                    kafka_idempotence=_idempotence(state), tenant_keys_file=Path(keys) if keys else None)


def save(state: StackState) -> None:
    path = Path(state.home) / "stack.json"
    path.write_text(json.dumps(asdict(state), indent=2))


def load() -> StackState | None:
    path = home_dir() / "stack.json"
    if not path.exists():
        return None
    return StackState(**json.loads(path.read_text()))


def down(progress=print) -> bool:
    state = load()
    if state is None:
        progress("no stack is up")
        return False
    # services and agents first, then their jobs (an agent leaves them running for the next one to
    # adopt), then the broker, then the database, so that in-flight work drains
    for name, pid in state.processes.items():
        stop_pid(pid)
        progress(f"stopped    {name} (pid {pid})")
    stop_stack_jobs(state.home, state.env, progress)
    broker = state.running_broker
    if broker is not None:
        stop_broker(broker)
        progress(f"stopped    {broker.label()} (pid {broker.pid})")
    if state.private_pg:
        postgres.stop_private(state.private_pg)
        progress("stopped    private PostgreSQL")
    _forget_config(state)
    (Path(state.home) / "stack.json").unlink(missing_ok=True)
    return True


def _forget_config(state: StackState) -> None:
    """Remove the client config `up` wrote, unless it names another server since (its token died with the
    stack's database)."""
    if state.config_path and state.gateway:
        path = Path(state.config_path)
        try:
            if client_config.read_config(path).get("server") == state.gateway:
                path.unlink(missing_ok=True)
        except client_config.NoServer:
            pass  # not ours to remove
