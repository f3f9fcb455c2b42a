"""Process shell shared by every service: build from settings, run until SIGTERM/SIGINT, shut down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from datetime import datetime, timedelta, timezone
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from faststream.kafka import KafkaBroker

from gpusched_common import signing
from gpusched_common.batching import Screen, TxHandler, subscribe_transactional
from gpusched_common.db import DATABASE_AWAY, create_pool
from gpusched_common.messaging import Handler, build_broker, guard_positions, poisoned, subscribe
from gpusched_common.relay import OutboxRelay, prune
from gpusched_common.settings import Settings
from gpusched_common.tasks import cancel_and_wait
from gpusched_common.tracing import configure_tracing

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    """The clock every service shell passes to its handlers (pure cores never read it)."""
    return datetime.now(timezone.utc)


class StoreClock:
    """The database server's clock, read through the process's own (issue 15): replicas whose clocks
    disagree (skew, a wrong NTP) still judge one lease by one clock, the store's. ``sync`` measures the
    offset (half the query's round trip allowed for); ``now`` is the process clock plus the last offset."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset

    async def sync(self, conn: asyncpg.Connection) -> None:
        before = datetime.now(timezone.utc)
        server = await conn.fetchval("SELECT clock_timestamp()")
        after = datetime.now(timezone.utc)
        self.offset = server - (before + (after - before) / 2)


@dataclass
class Runtime:
    service: str
    settings: Settings
    broker: KafkaBroker
    pool: asyncpg.Pool | None = None
    relay: OutboxRelay | None = None
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
    tasks: list[asyncio.Task] = field(default_factory=list)

    def subscribe(self, topic: str, group_id: str, handler: Handler, *,
                  partitions: Collection[int] | None = None, by_key: bool = False) -> object:
        """``messaging.subscribe``: the subscriber (``partitions``: only these, assigned by hand; ``by_key``:
        batches, keys handled concurrently)."""
        return subscribe(self.broker, topic=topic, group_id=group_id, service=self.service, settings=self.settings,
                         handler=handler, partitions=partitions, by_key=by_key)

    def subscribe_transactional(self, topic: str, group_id: str, handler: TxHandler, *,
                                screen: Screen | None = poisoned) -> None:
        """Batches of messages applied in one transaction each; the relay is woken by a commit that wrote
        outbox rows (its LISTEN), not by every batch. ``screen``: see ``batching.subscribe_transactional``."""
        assert self.pool is not None, "a transactional consumer needs the database"
        subscribe_transactional(self.broker, self.pool, topic=topic, group_id=group_id, service=self.service,
                                settings=self.settings, handler=handler, screen=screen)

    def wake_relay(self) -> None:
        if self.relay is not None:
            self.relay.wake()


def configure_logging(settings: Settings, service: str) -> None:
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)


@contextlib.asynccontextmanager
async def running(service: str, settings: Settings, setup: Callable[[Runtime], Awaitable[None]], *,
                  uses_database: bool = True) -> AsyncIterator[Runtime]:
    """Build a service from settings, start its consumers and background tasks, stop them on exit."""
    key_file = settings.service_key_file or (settings.service_keys_dir / f"{service}.key"
                                             if settings.service_keys_dir is not None else None)
    if key_file is not None and (settings.service_key_file is not None or key_file.exists()):
        signing.configure(signing.Signer(signing.load_key(key_file)))  # a bad key file: it does not start
    broker = build_broker(settings, client_id=service)
    runtime = Runtime(service=service, settings=settings, broker=broker)
    if uses_database:
        runtime.pool = await _connect_with_retry(settings.database_url)
        runtime.relay = OutboxRelay(runtime.pool, broker, service, poll_interval_s=settings.outbox_poll_interval_s,
                                    republish_s=settings.outbox_republish_s)
        runtime.background.append(runtime.relay.run)
        runtime.background.append(lambda: retention_loop(runtime))
    tasks: list[asyncio.Task] = []
    runtime.background.append(lambda: guard_positions(broker))  # a broker that lost its data: see there
    try:
        await setup(runtime)
        await _start_with_retry(broker)
        tasks = [asyncio.create_task(job(), name=f"{service}:{getattr(job, '__name__', 'task')}")
                 for job in runtime.background]
        runtime.tasks = tasks
        yield runtime
    finally:
        await cancel_and_wait(tasks, what=f"{service}'s background tasks")
        await broker.stop()
        if runtime.pool is not None:
            await runtime.pool.close()


async def retention_loop(runtime: Runtime) -> None:
    """Delete this service's published outbox rows and old inbox claims now and then (settings'
    ``*_retention_s``); an outage only postpones it."""
    settings, pool = runtime.settings, runtime.pool
    assert pool is not None
    while True:
        try:
            async with pool.acquire() as conn:
                now = utcnow()
                outbox, inbox = await prune(conn, runtime.service,
                                            outbox_before=now - timedelta(seconds=settings.outbox_retention_s),
                                            inbox_before=now - timedelta(seconds=settings.inbox_retention_s))
            if outbox or inbox:
                log.info("%s: pruned %d published outbox row(s) and %d inbox claim(s)", runtime.service, outbox, inbox)
        except DATABASE_AWAY as exc:
            log.warning("%s: retention postponed: %s", runtime.service, exc)
        await asyncio.sleep(settings.retention_interval_s)


async def run_service(service: str, settings: Settings, setup: Callable[[Runtime], Awaitable[None]], *,
                      uses_database: bool = True) -> None:
    """The process entry point: run until SIGTERM/SIGINT or until a background task dies."""
    configure_logging(settings, service)
    provider = configure_tracing(service, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with running(service, settings, setup, uses_database=uses_database) as runtime:
            log.info("%s started", service)
            stopper = asyncio.create_task(stop.wait())
            finished, _ = await asyncio.wait([stopper, *runtime.tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in finished:
                if task is not stopper and task.exception():
                    log.error("%s: background task %s died: %r", service, task.get_name(), task.exception())
            stopper.cancel()
            log.info("%s stopping", service)
    finally:
        if provider is not None:
            provider.shutdown()


async def _connect_with_retry(database_url: str) -> asyncpg.Pool:
    delay = 0.2
    while True:
        try:
            return await create_pool(database_url)
        except DATABASE_AWAY as exc:
            log.warning("database not reachable (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


async def _start_with_retry(broker: KafkaBroker) -> None:
    delay = 0.2
    while True:
        try:
            await broker.start()
            return
        except Exception as exc:  # noqa: BLE001 - broker unreachable at start: wait for it
            log.warning("broker not reachable (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
