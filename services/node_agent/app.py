"""Node agent process: one agent for this node (real or simulated NVML), or, with
GPUSCHED_SIMULATED_NODES > 1, a fleet of simulated agents `<node_id>-001..N` in one process."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace

from faststream.kafka import KafkaBroker

from gpusched_common import events as ev
from gpusched_common import senders
from gpusched_common.ignored import Ignored
from gpusched_common.kafka_client import client_options
from gpusched_common.messaging import Handler, Incoming, publish
from gpusched_common.partitioning import follow_partition_count, partitions_for, wait_for_partition_count
from gpusched_common.runtime import Runtime, run_service
from gpusched_common.signing import SIGNED_AT_HEADER, TrustedKeys
from gpusched_common.topics import NODES_COMMANDS, agent_group

from services.node_agent import watchdog
from services.node_agent.agent import Agent
from services.node_agent.cgroups import JobCgroups, Support, detect
from services.node_agent.config import AgentConfig
from services.node_agent.containers import ContainerRuntime, container_runtime
from services.node_agent.fleet import Fleet, fleet_node_ids
from services.node_agent.identity import load_identity
from services.node_agent.log_server import LogServer, log_app
from services.node_agent.nvml import make_backend
from services.node_agent.reporter import SERVICE, Send
from services.node_agent.runner import JobRunner, RunAs
from services.node_agent.settings import AgentSettings


def broker_sender(broker: KafkaBroker) -> Send:
    async def send(topic: str, key: str, value: bytes, headers: dict[str, str]) -> None:
        await publish(broker, topic, key, value, headers)

    return send


log = logging.getLogger(__name__)


def build_agent(settings: AgentSettings, node_id: str, send: Send, log_url: str | None = None) -> Agent:
    identity = load_identity(settings.agent_work_dir / node_id, node_id, settings.join_token(),
                             settings.agent_unenrolled)  # before anything runs: not enrolled, no token, no agent
    backend = make_backend(settings.nvml_backend, node_id, settings.simulated_gpus)
    containers = container_runtime(settings.agent_container_runtime, settings.agent_container_run_args,
                                   devices=settings.nvml_backend == "real")
    runner = job_runner(settings, node_id, cgroups=job_cgroups(settings, node_id, bool(backend.device_minors())),
                        containers=containers)
    config = AgentConfig.from_settings(settings, node_id)
    labels = {**config.labels, **(containers.labels() if containers is not None else {})}
    config = replace(config, log_url=log_url, labels=labels)
    return Agent(config, send, backend, runner, identity=identity)


def job_runner(settings: AgentSettings, node_id: str, cgroups: JobCgroups | None = None,
               containers: ContainerRuntime | None = None) -> JobRunner:
    """The runner of one node's jobs, with the users its tenants' jobs run as, the environment allowlist,
    the cgroups that limit each job (none given: no limits) and the container runtime (none: no images)."""
    passthrough = tuple(k.strip() for k in settings.agent_job_env_passthrough.split(",") if k.strip())
    return JobRunner(settings.agent_work_dir / node_id, RunAs.parse(settings.agent_job_users), passthrough,
                     cgroups, containers)


def job_cgroups(settings: AgentSettings, node_id: str, has_devices: bool) -> JobCgroups:
    """The cgroups this node can put its jobs in (``GPUSCHED_AGENT_CGROUPS=off``: none)."""
    if settings.agent_cgroups == "off":
        return JobCgroups(Support("none", "not enforced: GPUSCHED_AGENT_CGROUPS=off",
                                  "not enforced: GPUSCHED_AGENT_CGROUPS=off", "not enforced: GPUSCHED_AGENT_CGROUPS=off"))
    support = detect(settings.agent_cgroup_root, has_devices=has_devices, node_id=node_id)
    log.info("%s: job limits: cpu %s; memory %s; devices %s", node_id, support.cpu, support.memory, support.devices)
    return JobCgroups(support)


def build_log_server(settings: AgentSettings, node_ids: list[str]) -> LogServer | None:
    public_key = settings.gateway_public_key()
    if public_key is None:
        return None
    paths = {node_id: JobRunner(settings.agent_work_dir / node_id).log_path for node_id in node_ids}
    return LogServer(log_app(public_key, paths, retention_s=settings.agent_log_retention_s),
                     settings.agent_log_host,
                     settings.agent_log_port, settings.agent_log_url)


def build_fleet(settings: AgentSettings, send: Send, log_server: LogServer | None = None) -> Fleet:
    if settings.simulated_nodes > 1:
        if settings.nvml_backend != "simulated":
            raise ValueError("GPUSCHED_SIMULATED_NODES > 1 needs GPUSCHED_NVML_BACKEND=simulated")
        node_ids = fleet_node_ids(settings.node_id, settings.simulated_nodes)
    else:
        node_ids = [settings.node_id]
    url = log_server.url if log_server is not None else None
    return Fleet(build_agent(settings, node_id, send, url) for node_id in node_ids)


UNTRUSTED = Ignored("node commands no trusted sender signed")


def command_refusal(trusted: TrustedKeys, message: Incoming, now: float) -> str | None:
    """Why a node command is not run (None: run it): a trusted sender must have signed it for this topic,
    within its window, and, where the sender is named, be one the senders table lets send its type."""
    refused = trusted.check(message.topic, message.value, message.headers)
    if refused is not None:
        return refused
    try:
        event_type = ev.Envelope.model_validate_json(message.value).type
    except ValueError:
        return None  # unreadable: the handler dead-letters it
    rule = senders.rule_for(message.topic, event_type)
    if rule is None:
        return f"{event_type[:40]} is no node command"
    if not senders.within_window(message.headers.get(SIGNED_AT_HEADER), now, rule.max_age_s):
        return f"signed at {message.headers.get(SIGNED_AT_HEADER, '')[:20]}, outside its {rule.max_age_s:.0f} s window"
    name = trusted.sender(message.headers)
    if name is not None and not senders.may_send(message.topic, event_type, name):
        return f"{name} may not send {event_type}"
    return None


def signed_only(trusted: TrustedKeys | None,
                handle: Callable[[Incoming], Awaitable[None]]) -> Callable[[Incoming], Awaitable[None]]:
    """Run a node command only when placement or preemption signed it for this topic (``trusted``;
    None: development, every command is run)."""
    if trusted is None:
        return handle

    async def on_command(message: Incoming) -> None:
        refused = command_refusal(trusted, message, time.time())
        if refused is not None:
            UNTRUSTED.note(message.headers.get("event-type", "command")[:40], refused)
            return
        await handle(message)

    return on_command


def own_commands_only(node_ids: Collection[str], handle: Handler) -> Handler:
    """Pass on only the commands keyed by a node of this process, before anything else is done with them:
    a partition carries the commands of every node whose id hashes to it (~16 at 1,000 nodes on 64
    partitions), and only this process's own are worth a signature check."""
    own = frozenset(node_ids)

    async def on_command(message: Incoming) -> None:
        if message.key in own:
            await handle(message)

    return on_command


def agent_setup(settings: AgentSettings) -> tuple[Callable[[Runtime], Awaitable[None]], list[Fleet]]:
    """The runtime setup of an agent process, and a list that holds its fleet once built."""
    settings = AgentSettings.of(settings)
    trusted = settings.command_keys()  # before anything starts: no keys, no agent (unless development)
    if trusted is None:
        log.warning("GPUSCHED_AGENT_ACCEPT_UNSIGNED_COMMANDS=true: anyone who can write to the broker runs "
                    "commands on this node (development only)")
    built: list[Fleet] = []

    async def setup(runtime: Runtime) -> None:
        node_ids = fleet_node_ids(settings.node_id, settings.simulated_nodes) if settings.simulated_nodes > 1 \
            else [settings.node_id]
        log_server = build_log_server(settings, node_ids)
        fleet = build_fleet(settings, broker_sender(runtime.broker), log_server)
        if log_server is not None:
            runtime.background.append(log_server.run)
        built.append(fleet)
        group = agent_group(settings.node_id if settings.simulated_nodes <= 1 else f"fleet-{settings.node_id}")
        count = await wait_for_partition_count(client_options(settings), NODES_COMMANDS.name)
        mine = partitions_for(node_ids, count)
        log.info("%s: reading partition(s) %s of the %d of %s", group, ", ".join(map(str, mine)), count,
                 NODES_COMMANDS.name)
        subscriber = runtime.subscribe(NODES_COMMANDS.name, group,
                                       own_commands_only(node_ids, signed_only(trusted, fleet.on_command)),
                                       partitions=mine, by_key=True)  # a fleet's nodes start their jobs at once
        runtime.background.append(lambda: follow_partition_count(subscriber, NODES_COMMANDS.name, node_ids, count))
        runtime.background.append(fleet.run)
        if settings.agent_watchdog:
            dirs = [settings.agent_work_dir / node_id for node_id in node_ids]
            runtime.background.append(lambda: keep_watchdog(dirs))

    return setup, built


async def keep_watchdog(dirs: list) -> None:
    """Keep a watchdog watching the nodes' directories (one left by the agent's last life will do)."""
    while True:
        try:
            started = watchdog.ensure(dirs)
            if started is not None:
                log.info("watchdog started (pid %d) for %d node(s)", started.pid, len(dirs))
        except OSError as exc:
            log.error("cannot start the watchdog: %s", exc)
        await asyncio.sleep(WATCHDOG_CHECK_S)


WATCHDOG_CHECK_S = 5.0


async def main(settings: AgentSettings | None = None) -> None:
    settings = settings or AgentSettings()
    os.umask(0o077)  # the agent's records, logs and keys are its own (jobs get a directory of their own)
    setup, built = agent_setup(settings)
    name = f"{SERVICE}-{settings.node_id}" if settings.simulated_nodes <= 1 else f"{SERVICE}-fleet-{settings.node_id}"
    try:
        await run_service(name, settings, setup, uses_database=False)
    finally:
        for fleet in built:
            for agent in fleet.agents.values():
                agent.backend.close()
