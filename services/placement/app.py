"""Placement service: places quota-reserved jobs on GPUs and tells node agents to start them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

import asyncpg

from gpusched_common import kafka_admin
from gpusched_common.db import DATABASE_AWAY, yielding_to_live_work
from gpusched_common.kafka_client import client_options
from gpusched_common.pacing import CyclePacer, run_due
from gpusched_common.runtime import Runtime, StoreClock, run_service
from gpusched_common.stores.cluster import ClusterCache
from gpusched_common.topics import (
    GROUP_PLACEMENT_CONTROL,
    GROUP_PLACEMENT_JOBS,
    GROUP_PLACEMENT_NODES,
    JOBS_CONTROL,
    JOBS_EVENTS,
    NODES_REPORTS,
)

from gpusched_core import placement as engine
from gpusched_core.placement import kernel
from gpusched_core.placement.leases import caught_up
from services.placement import recovery, republish, starts, store
from services.placement.handlers import check_leases, make_handler, run_cycle
from services.placement.settings import PlacementSettings
from services.placement.node_control import make_node_control_handler
from services.placement.store import SERVICE

log = logging.getLogger(__name__)
LEASE_CHECK_INTERVAL_S = 1.0


class ReportsRead:
    """Whether placement has read, by now, every node report that was in the broker at its previous pass: what
    the passes that act on the nodes' own accounts wait for (the StartJobs re-sent to nodes that did not
    acknowledge them, the ReconcileJobs to nodes that seem to run other jobs than the store says). Behind on
    the reports, a start acknowledged long ago looks unanswered and a node's account is an old one: acting on
    them would send the nodes commands they answer with more reports, and placement falls further behind (a
    burst into 1,000 simulated nodes did: StartJobs re-sent by the thousand, the reports' backlog growing by
    200 a second, jobs that ran never recorded as started)."""

    def __init__(self, options: dict) -> None:
        self._options = options
        self._barrier: dict[int, int] = {}  # the reports topic's end offsets at the previous pass
        self.current = False

    async def check(self) -> bool:
        try:
            ends, committed = await kafka_admin.group_backlog(self._options, NODES_REPORTS.name,
                                                              GROUP_PLACEMENT_NODES, timeout_s=3.0)
        except Exception as exc:  # noqa: BLE001 - a broker that does not answer: nothing is known to be read
            log.debug("placement: the backlog of node reports cannot be read (%s)", type(exc).__name__)
            current = False
        else:
            current = bool(self._barrier) and caught_up(self._barrier, committed)
            self._barrier = ends
        if current != self.current:
            (log.info if current else log.warning)(
                "placement %s the node reports: StartJobs are re-sent and drifted nodes reconciled %s",
                "has caught up with" if current else "is behind on",
                "again" if current else "only once it has read them")
        self.current = current
        return current


async def due_cycles(runtime: Runtime, clock: Callable[[], datetime], policy: engine.PlacementPolicy,
                     cache: ClusterCache, pacer: CyclePacer) -> None:
    """The cycles batches left due (``gpusched_common.pacing``), each in a transaction of its own, from the
    store alone."""
    assert runtime.pool is not None
    pool = runtime.pool

    async def cycle(_key: str) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await run_cycle(conn, clock(), policy, cache)
        runtime.wake_relay()

    def failed(_key: str, exc: BaseException) -> None:
        log.warning("placement: a due cycle failed (%s); it is due again shortly", exc)

    await run_due(pacer, cycle, failed)


async def setup(runtime: Runtime) -> None:
    settings: PlacementSettings = runtime.settings
    policy = engine.make_policy(settings.placement_policy)
    in_c = kernel.use(settings.placement_kernel == "c")
    log.info("placement policy: %s (fragmentation growth in %s)", policy.name, "C" if in_c else "numpy")
    if settings.placement_kernel == "c" and not in_c:
        log.warning("placement: the engine's C kernel is not built (no C compiler when gpusched was installed): "
                    "decisions are the same, computed by numpy, about half as fast")
    cache = ClusterCache()  # one per placement process
    # leases are judged by the store's clock (synced every lease check): replicas with skewed clocks agree
    clock = StoreClock()
    utcnow = clock.now
    if settings.accept_unsigned_node_reports:
        log.warning("GPUSCHED_ACCEPT_UNSIGNED_NODE_REPORTS=true: anyone who can write to the broker speaks for any "
                    "node (development only)")
    pacer = CyclePacer(settings.placement_cycle_share)
    handler = make_handler(utcnow, policy, cache, accept_unsigned=settings.accept_unsigned_node_reports, pacer=pacer)
    if runtime.relay is not None:  # after a broker lost its data, only the commands with work left go again
        runtime.relay.done_with = republish.commands_done
    # one group per topic: each subscription is its own consumer
    runtime.subscribe_transactional(JOBS_EVENTS.name, GROUP_PLACEMENT_JOBS, handler)
    runtime.subscribe_transactional(NODES_REPORTS.name, GROUP_PLACEMENT_NODES, handler)
    runtime.subscribe_transactional(JOBS_CONTROL.name, GROUP_PLACEMENT_CONTROL,
                                    make_node_control_handler(utcnow, policy, cache, pacer))

    runtime.background.append(lambda: due_cycles(runtime, utcnow, policy, cache, pacer))

    barrier: dict[int, int] = {}  # the reports topic's end offsets when leases were first seen to lapse
    asked = [0.0]  # when listening() was last asked (a barrier older than a few checks is from another lapse)

    async def listening() -> bool:
        """Whether placement has read every node report that was in the broker when a lease was first seen
        to lapse (else a heartbeat may wait in that backlog: placement is behind, the node is not silent)."""
        now = asyncio.get_running_loop().time()
        if now - asked[0] > 3 * LEASE_CHECK_INTERVAL_S:
            barrier.clear()
        asked[0] = now
        try:
            ends, committed = await kafka_admin.group_backlog(client_options(settings), NODES_REPORTS.name,
                                                              GROUP_PLACEMENT_NODES, timeout_s=3.0)
        except Exception as exc:  # noqa: BLE001 - a broker that does not answer: placement cannot listen either
            log.warning("leases lapsed, but the backlog of node reports cannot be read (%s); waiting",
                        type(exc).__name__)
            return False
        if not barrier:
            barrier.update(ends)
        if caught_up(barrier, committed):
            barrier.clear()
            return True
        log.warning("leases lapsed while placement is behind on node reports; reading them first")
        return False

    async def lease_loop() -> None:
        # Heartbeats that arrived while placement was down are still in Kafka, not yet in the table: give
        # every node a fresh lease at start rather than declare the whole cluster lost.
        while True:  # a database still starting up (it was just restarted) is waited for, not died of
            try:
                async with runtime.pool.acquire() as conn:
                    await clock.sync(conn)
                    await store.refresh_leases(conn, utcnow())
                break
            except DATABASE_AWAY as exc:
                log.warning("placement: leases not refreshed yet (%s); retrying", type(exc).__name__)
                await asyncio.sleep(1.0)
        loop = asyncio.get_running_loop()
        reports = ReportsRead(client_options(settings))
        stops_sent: dict = {}  # when each cancelled job was last told to stop again (recovery)
        last_cycle, checked_at = 0.0, loop.time()
        while True:
            await asyncio.sleep(LEASE_CHECK_INTERVAL_S)
            pass_due = loop.time() - last_cycle >= settings.reconcile_interval_s
            reports_read = pass_due and await reports.check()  # asked before the transaction: no lock held
            # how long placement was not checking beyond its own sleep (the last check's own work aside):
            # a pause, a stalled event loop, a database that did not answer, a broker slow to say the backlog
            away = loop.time() - checked_at - LEASE_CHECK_INTERVAL_S
            try:
                async with runtime.pool.acquire() as conn, conn.transaction():
                    await clock.sync(conn)
                    lost = await check_leases(conn, utcnow(), policy, cache, away_s=away, listening=listening)
                    if pass_due:
                        # the bus wakes placement up, the store is its memory: a periodic cycle from the
                        # store alone places whatever a lost or delayed message left waiting
                        last_cycle = asyncio.get_running_loop().time()
                        lapsed = await store.expire_nominations(conn, utcnow(), settings.nomination_ttl_s)
                        if lapsed:
                            log.warning("GPUs held for %s were not used within %.0f s; released to everyone",
                                        ", ".join(lapsed), settings.nomination_ttl_s)
                        try:
                            async with yielding_to_live_work(conn):
                                recovered = await recovery.recover(conn, utcnow(), resend_s=settings.start_resend_s,
                                                                   stops_sent=stops_sent, drift=reports_read)
                        except asyncpg.LockNotAvailableError:
                            log.info("placement recovery yielded to a batch holding the same jobs; it runs again "
                                     "at the next pass")
                        else:
                            if recovered.cluster_changed:
                                cache.forget()
                            if summary := recovered.summary():
                                log.warning("placement recovered from the store: %s", summary)
                        await run_cycle(conn, utcnow(), policy, cache)
                        if reports_read:
                            await starts.resend_unacknowledged(conn, utcnow(), settings.start_resend_s)
                checked_at = loop.time()
            except Exception:  # noqa: BLE001 - a database outage must not end the lease checks
                log.exception("lease check failed; retrying")
                continue
            if lost:
                log.warning("node(s) %s lost their lease; their jobs were requeued", ", ".join(lost))
                runtime.wake_relay()

    runtime.background.append(lease_loop)


async def main(settings: PlacementSettings | None = None) -> None:
    await run_service(SERVICE, settings or PlacementSettings(), setup)
