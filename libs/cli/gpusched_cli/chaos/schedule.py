"""The seeded fault schedule (pure): which fault, on what, for how long, in what order.

Every kind appears at least once when the schedule is at least as long as the list of kinds (a short
campaign is one of each); the rest are drawn with the seed. Durations are in terms of the stack's lease, so
a pause is longer than the lease and a stall longer than the consumer session, whatever they are set to.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KILL_SERVICE = "kill_service"  # SIGKILL a service process; started again after a moment
KILL_RELAY = "kill_relay"  # SIGKILL the process holding a producer's outbox relay
PAUSE_SERVICE = "pause_service"  # SIGSTOP a service longer than the lease, then SIGCONT
PAUSE_AGENT = "pause_agent"  # SIGSTOP a node agent longer than lease + grace: its node is declared lost
PG_RESTART = "pg_restart"  # PostgreSQL stopped in immediate mode (as a crash), started again
BROKER_RESTART = "broker_restart"  # the broker killed and started again (Tansu: losing all its data)
AGENT_WIPE = "agent_wipe"  # a node reimaged: its agent and jobs killed, its work directory wiped (not its key)
AGENT_FEWER_GPUS = "agent_fewer_gpus"  # a node's agent back with two GPUs fewer (then with all of them)
CONSUMER_STALL = "consumer_stall"  # a consumer paused past its session timeout (its group rebalances)
CLOCK_SKEW = "clock_skew"  # one replica restarted with its clock ahead (libfaketime), later set right

KINDS = (KILL_SERVICE, KILL_RELAY, PAUSE_SERVICE, PAUSE_AGENT, PG_RESTART, BROKER_RESTART, AGENT_WIPE,
         AGENT_FEWER_GPUS, CONSUMER_STALL, CLOCK_SKEW)


@dataclass(frozen=True)
class Targets:
    services: tuple[str, ...]  # every service process by name (replicas "<service>-2"), the gateway included
    replicas: tuple[str, ...]  # the second replicas (clock skew)
    consumers: tuple[str, ...]  # services whose consumers are worth stalling
    relays: tuple[str, ...]  # producers whose relay holder may be killed
    agents: tuple[str, ...]  # workload node agents by process name (never the probe node's)


@dataclass(frozen=True)
class Timing:
    lease_s: float  # the agents' lease
    grace_s: float  # the fencing grace
    session_s: float  # the consumers' session timeout


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    target: str
    duration_s: float  # how long the fault lasts before it is healed
    gap_s: float  # quiet time before it is injected


def make_schedule(seed: int, count: int, targets: Targets, timing: Timing,
                  kinds: tuple[str, ...] = KINDS) -> tuple[Fault, ...]:
    rng = random.Random(seed)
    chosen = list(kinds) if count >= len(kinds) else rng.sample(list(kinds), count)
    chosen += [rng.choice(kinds) for _ in range(count - len(chosen))]
    rng.shuffle(chosen)
    return tuple(Fault(i, kind, _target(rng, kind, targets), round(_duration(rng, kind, timing), 2),
                       round(rng.uniform(1.0, 3.0), 2)) for i, kind in enumerate(chosen))


def _target(rng: random.Random, kind: str, targets: Targets) -> str:
    pool = {KILL_SERVICE: targets.services, KILL_RELAY: targets.relays, PAUSE_SERVICE: targets.services,
            PAUSE_AGENT: targets.agents, AGENT_WIPE: targets.agents, AGENT_FEWER_GPUS: targets.agents,
            CONSUMER_STALL: targets.consumers, CLOCK_SKEW: targets.replicas}.get(kind)
    return rng.choice(pool) if pool else "-"


def _duration(rng: random.Random, kind: str, timing: Timing) -> float:
    if kind in (PAUSE_SERVICE,):
        return timing.lease_s + rng.uniform(1.0, 3.0)  # longer than the lease
    if kind == PAUSE_AGENT:
        return timing.lease_s + timing.grace_s + rng.uniform(2.0, 4.0)  # its node is declared lost
    if kind == CONSUMER_STALL:
        return timing.session_s + rng.uniform(1.5, 3.0)  # past its session timeout
    if kind in (AGENT_FEWER_GPUS, CLOCK_SKEW):
        return rng.uniform(8.0, 12.0)  # how long the node (the replica) runs so
    if kind in (PG_RESTART, BROKER_RESTART):
        return rng.uniform(2.0, 5.0)  # down this long
    return rng.uniform(0.5, 2.0)  # killed processes are started again after this
