"""Placement's handler of operators' node control (``CordonNode`` on ``gpusched.jobs.control``, keyed by the
node id): cordon (no new work is placed there; what runs goes on) and uncordon (placed on again). Only a
producer that attests may send it (the gateway, having authorized an operator); each change is an event on
the node's stream with who asked and why. Job control on the same topic is admission's, not ours."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

import asyncpg

from gpusched_common import events as ev
from gpusched_common import producers
from gpusched_common.batching import Batch, TxHandler
from gpusched_common.identity import OPERATOR
from gpusched_common.messaging import Incoming, parse_event
from gpusched_common.pacing import CyclePacer
from gpusched_common.store import claim
from gpusched_common.stores.cluster import ClusterCache, lock_cycle
from gpusched_common.jobs import append_job_events, load_job
from gpusched_core import lifecycle
from gpusched_core import placement as engine
from gpusched_core.preemption.jobs import preempt_commands

from services.placement import store
from services.placement.handlers import cycle_after
from services.placement.store import SERVICE

log = logging.getLogger(__name__)


def make_node_control_handler(clock: Callable[[], datetime], policy: engine.PlacementPolicy,
                              cache: ClusterCache, pacer: CyclePacer | None = None) -> TxHandler:
    pacer = pacer or CyclePacer(share=1.0)

    async def on_control(conn: asyncpg.Connection, message: Incoming, batch: Batch) -> None:
        envelope, payload = parse_event(message)
        if not isinstance(payload, ev.CordonNode):
            return  # a job's control request: admission decides it
        if not await claim(conn, SERVICE, envelope.event_id):
            return
        if producers.PRODUCER_HEADER not in message.headers:
            log.warning("refused %s of %s: not signed by a producer", envelope.type, payload.node_id)
            return
        verdict = await producers.verify(conn, message.headers, message.value, OPERATOR, payload.requested_by,
                                         must_attest=True)
        if verdict.reason is not None:
            log.warning("refused %s of %s: %s", envelope.type, payload.node_id, verdict.reason)
            return
        now = clock()
        await lock_cycle(conn)  # nodes are the cycle's input: their writers hold its lock
        if await cordon(conn, payload, now) and not payload.cordon:
            cycle_after(batch, clock, policy, cache, pacer)

    return on_control


async def cordon(conn: asyncpg.Connection, request: ev.CordonNode, now: datetime) -> bool:
    """Apply the request; True when it changed the node (an unknown node, or one cordoned already, is
    left as it is). A drain also preempts every job on the node through the checkpoint protocol: each is
    told (SIGTERM and a notice with its deadline), may checkpoint, and resumes on another node."""
    drain = request.cordon and request.drain_grace_s is not None
    if not await store.set_cordon(conn, request.node_id, request.cordon, request.requested_by, request.reason, now,
                                  drain=drain):
        log.info("%s of %s: nothing to change", "cordon" if request.cordon else "uncordon", request.node_id)
        return False
    event: ev.Payload = (ev.NodeCordoned(node_id=request.node_id, reason=request.reason,
                                         requested_by=request.requested_by, draining=drain) if request.cordon
                         else ev.NodeUncordoned(node_id=request.node_id, requested_by=request.requested_by))
    await store.record_node_event(conn, event, now)
    if drain:
        assert request.drain_grace_s is not None
        await drain_jobs(conn, request.node_id, request.drain_grace_s, request.reason, now)
    return True


async def drain_jobs(conn: asyncpg.Connection, node_id: str, grace_s: float, reason: str, now: datetime) -> None:
    """Preempt what runs on the node (every member of a gang), as the preemption service does for a
    priority job: the job is asked, may checkpoint until the deadline, and queues again to resume."""
    deadline = now + timedelta(seconds=grace_s)
    why = f"node {node_id} is being drained: {reason}"
    for job_id in await store.jobs_on(conn, node_id):
        state = await load_job(conn, job_id)
        asked = lifecycle.RequestPreemption(f"drain:{node_id}", 0, "", why, grace_s, deadline)
        events = lifecycle.decide(state, asked, now)
        if not events:
            continue  # stopping already (preempted or cancelled): nothing more to ask
        await append_job_events(conn, state, events, producer=SERVICE, now=now)
        for command in preempt_commands(state, grace_s, deadline, why):
            await store.send_command(conn, command, command.node_id, now)
