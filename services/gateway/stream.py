"""``GET /v1/stream``: one server-sent event stream of what changes, for the dashboard's live pages.

One ``ChangeFeed`` per gateway process reads the event store's global order (every ``poll_s``, only while
someone listens: one query however many browsers are open, so no polling storm) and fans each event out to
the subscribers that may see it:

- ``event: job`` ``{"position", "job_id", "tenant", "type", "at"}`` for a job event, to a principal that may
  list that tenant's jobs (``job.list``: a user sees its own tenant's, an operator everyone's);
- ``event: cluster`` ``{"at"}``: something changed that the cluster view shows, to a principal that may read
  nodes, at most once per ``cluster_every_s``;
- ``event: reset``: the subscriber fell more than ``MAX_QUEUED`` events behind (a slow client); what was
  queued is dropped and the page reloads its view instead.

The stream ends after ``gateway_follow_max_s`` (the browser's EventSource reconnects); a comment line every
15 s keeps proxies from closing a quiet one. The route's own action is ``queue.read`` (every role that may
watch anything has it); what each event needs is judged per event above."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from gpusched_core.access import Action, Principal, Resource, authorize

from services.gateway import store
from services.gateway.auth import Caller, acts, allowed, within_rate

log = logging.getLogger(__name__)
router = APIRouter()
MAX_QUEUED = 2000
JOB_PREFIX = "job-"


@dataclass(eq=False)
class Subscriber:
    principal: Principal
    sees_nodes: bool
    only_tenant: str | None = None  # the tenant the request narrowed to (None: every one it may see)
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = field(default_factory=lambda: asyncio.Queue(MAX_QUEUED))
    tenants: dict[str | None, bool] = field(default_factory=dict)  # tenant -> may list its jobs (memo)
    behind: bool = False
    cluster_due: bool = False

    def sees(self, tenant: str | None) -> bool:
        if self.only_tenant is not None and tenant != self.only_tenant:
            return False
        if tenant not in self.tenants:
            resource = Resource.in_tenant(tenant) if tenant else Resource.cluster()
            decision = authorize(self.principal, Action.JOB_LIST, resource)
            self.tenants[tenant] = decision.allowed and (tenant is not None or decision.tenant is None)
        return self.tenants[tenant]

    def offer(self, kind: str, data: dict[str, Any]) -> None:
        if self.behind:
            return
        try:
            self.queue.put_nowait((kind, data))
        except asyncio.QueueFull:
            self.behind = True
            while not self.queue.empty():
                self.queue.get_nowait()


class ChangeFeed:
    def __init__(self, pool: Any, *, poll_s: float = 0.25, batch: int = 1000) -> None:
        self.pool, self.poll_s, self.batch = pool, poll_s, batch
        self.subscribers: set[Subscriber] = set()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def subscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.add(subscriber)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-change-feed")
        self._wake.set()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        position: tuple[int, int] | None = None
        while True:
            if not self.subscribers:
                self._wake.clear()
                await self._wake.wait()
                position = None  # nobody listened meanwhile: start again from the tail
            try:
                async with self.pool.acquire() as conn:
                    if position is None:
                        position = await store.feed_tail(conn)
                        rows = []
                    else:
                        rows = await store.feed_after(conn, position, self.batch)
            except Exception as exc:  # noqa: BLE001 - the database is away: try again, browsers keep their pages
                log.warning("change feed: cannot read the event store (%s)", type(exc).__name__)
                await asyncio.sleep(max(self.poll_s, 1.0))
                continue
            if rows:
                position = (rows[-1]["txid"], rows[-1]["global_position"])
                self.fan_out(rows)
            if len(rows) < self.batch:
                await asyncio.sleep(self.poll_s)

    def fan_out(self, rows: list[dict[str, Any]]) -> None:
        jobs = [job_event(r) for r in rows if r["stream_id"].startswith(JOB_PREFIX)]
        for subscriber in list(self.subscribers):
            for event in jobs:
                if subscriber.sees(event["tenant"]):
                    subscriber.offer("job", event)
            if subscriber.sees_nodes:
                subscriber.cluster_due = True


def job_event(row: dict[str, Any]) -> dict[str, Any]:
    return {"position": row["global_position"], "job_id": row["stream_id"][len(JOB_PREFIX):],
            "tenant": row["tenant"], "type": row["type"], "at": row["recorded_at"].isoformat()}


def sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@router.get("/v1/stream", openapi_extra=acts(Action.QUEUE_READ), response_model=None)
async def stream(request: Request, principal: Caller, tenant: str | None = None,
                 max_s: Annotated[float | None, Query(ge=0)] = None) -> StreamingResponse:
    """What changes, as server-sent events (see the module docstring): job events the caller may see (of
    ``tenant`` only, where given) and hints that the cluster changed; the stream ends after ``max_s``
    seconds (at most ``gateway_follow_max_s``)."""
    within_rate(request, principal, "read")
    scoped = allowed(principal, Action.QUEUE_READ, Resource.in_tenant(tenant))
    subscriber = Subscriber(principal, authorize(principal, Action.NODES_READ, Resource.cluster()).allowed,
                            only_tenant=scoped)
    limit_s = request.app.state.settings.gateway_follow_max_s
    return StreamingResponse(_events(request, subscriber, min(limit_s, max_s if max_s is not None else limit_s)),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache",
                                                                      "X-Accel-Buffering": "no"})


async def _events(request: Request, subscriber: Subscriber, max_s: float) -> AsyncIterator[bytes]:
    feed: ChangeFeed = request.app.state.change_feed
    settings = request.app.state.settings
    loop = asyncio.get_running_loop()
    feed.subscribe(subscriber)
    try:
        yield b"retry: 2000\n\n"
        deadline, quiet_since, cluster_sent = loop.time() + max_s, loop.time(), 0.0
        while loop.time() < deadline and not await request.is_disconnected():
            if subscriber.behind:
                subscriber.behind = False
                yield sse("reset", {})
                continue
            try:
                async with asyncio.timeout(0.5):  # not wait_for: see relay._pump
                    kind, data = await subscriber.queue.get()
                yield sse(kind, data)
                quiet_since = loop.time()
            except TimeoutError:
                pass
            if subscriber.cluster_due and loop.time() - cluster_sent >= settings.gateway_stream_cluster_every_s:
                subscriber.cluster_due, cluster_sent = False, loop.time()
                yield sse("cluster", {"at": datetime.now(UTC).isoformat()})
            if loop.time() - quiet_since > 15:
                yield b": still here\n\n"
                quiet_since = loop.time()
    finally:
        feed.unsubscribe(subscriber)
