"""How an agent's reports leave the node: enveloped, keyed by node, and, for reports that must not be
lost (starts, exits, health, registrations), queued and sent in order by one sender that retries each
until the broker accepts it."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

from gpusched_common import events as ev
from gpusched_common.signing import Signer
from gpusched_common.tasks import cancel_and_wait
from gpusched_common.topics import NODES_REPORTS
from gpusched_common.tracing import context_from_traceparent, current_traceparent, tracer

SERVICE = "node-agent"
log = logging.getLogger(__name__)

Send = Callable[[str, str, bytes, dict[str, str]], Awaitable[None]]
_Queued = tuple[ev.Payload, str | None, Callable[[], None] | None]


ATTEMPT_TIMEOUT_S = 5.0  # one try at sending a queued report; then it is sent again (the same envelope)


class Reporter:
    def __init__(self, node_id: str, send: Send, partitioned: Callable[[], bool],
                 signer: Signer | None = None, attempt_timeout_s: float = ATTEMPT_TIMEOUT_S) -> None:
        self._node_id = node_id
        self._signer = signer  # the node's own key: placement and metrics believe only what it signed
        self._send = send
        self._partitioned = partitioned
        self._attempt_timeout_s = attempt_timeout_s
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self._sender: asyncio.Task | None = None

    async def report(self, payload: ev.Payload, topic: str = NODES_REPORTS.name) -> None:
        """Send one report now; raises when the broker does not take it."""
        await self._send_enveloped(self._envelope(payload), topic)

    def _envelope(self, payload: ev.Payload) -> ev.Envelope:
        return ev.make_envelope(payload, event_id=str(uuid.uuid4()), stream_id=f"node-{self._node_id}",
                                occurred_at=datetime.now(timezone.utc), producer=f"{SERVICE}/{self._node_id}",
                                traceparent=current_traceparent())

    async def _send_enveloped(self, envelope: ev.Envelope, topic: str = NODES_REPORTS.name) -> None:
        if self._partitioned():
            raise ConnectionError(f"{self._node_id}: simulated network partition")
        headers = {"event-type": envelope.type}
        if envelope.traceparent:
            headers["traceparent"] = envelope.traceparent
        value = envelope.model_dump_json().encode()
        if self._signer is not None:
            headers.update(self._signer.headers(topic, value))  # signed again each try: its time is now
        await self._send(topic, self._node_id, value, headers)

    async def report_until_sent(self, payload: ev.Payload) -> None:
        """Send the report until the broker takes it. Each try is bounded: a send the client never answers
        (seen after a broker restart: the registration that followed a NodeLost waited 2+ minutes while
        heartbeats went out, and the node stayed Lost) is given up and sent again, as the same envelope,
        so a receiver that got both drops the second by its event id."""
        envelope = self._envelope(payload)
        delay = 0.2
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11, wait_for swallows a cancel that comes as the send
                # completes, and close() would wait for a sender that never stops
                async with asyncio.timeout(self._attempt_timeout_s):
                    await self._send_enveloped(envelope)
                return
            except Exception as exc:  # noqa: BLE001 - keep the report until the broker takes it
                log.warning("%s: could not report %s (%s); retrying", self._node_id, payload.TYPE,
                            exc or type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def in_order(self, payload: ev.Payload, on_sent: Callable[[], None] | None = None) -> None:
        """Queue a report that must not be lost; `on_sent` runs once the broker took it."""
        self._queue.put_nowait((payload, current_traceparent(), on_sent))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_queued())

    async def _send_queued(self) -> None:
        while True:
            payload, traceparent, on_sent = await self._queue.get()
            try:
                with tracer().start_as_current_span(f"{SERVICE} report {payload.TYPE}",
                                                    context=context_from_traceparent(traceparent)):
                    await self.report_until_sent(payload)
                if on_sent is not None:
                    on_sent()
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        """Wait until every queued report was sent."""
        await self._queue.join()

    async def close(self) -> None:
        if self._sender is not None:
            await cancel_and_wait([self._sender], what="the report sender")
