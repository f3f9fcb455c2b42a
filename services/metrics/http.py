"""A minimal HTTP endpoint on asyncio: `/metrics` (Prometheus text format), `/idle` (the allocated-but-idle
report, JSON), `/views` (cluster, pool, model, tenant views and backlog, JSON), `/healthz`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import asdict

from services.metrics.exporter import CONTENT_TYPE, Latest, MetricsExporter

log = logging.getLogger(__name__)
_MAX_REQUEST_BYTES = 8192


def views_document(latest: Latest) -> dict:
    views = latest.views
    if views is None:
        return {}
    groups = [("cluster", [views.cluster]), ("pools", views.pools), ("models", views.models)]
    doc: dict = {name: [{**asdict(g), "mean_utilization": g.mean_utilization, "allocation_ratio": g.allocation_ratio}
                        for g in items] for name, items in groups}
    doc.update(backlog=[asdict(b) for b in views.backlog], tenants=[asdict(t) for t in views.tenants],
               fragmentation=dict(views.fragmentation), idle=[asdict(a) for a in views.idle])
    return doc


class MetricsEndpoint:
    def __init__(self, exporter: MetricsExporter, latest: Latest) -> None:
        self._exporter = exporter
        self._routes: dict[str, Callable[[], tuple[bytes, str]]] = {
            "/views": lambda: (json.dumps(views_document(latest), default=str).encode(), "application/json"),
            "/idle": lambda: (json.dumps(views_document(latest).get("idle", []), default=str).encode(),
                              "application/json"),
            "/healthz": lambda: (b"ok\n", "text/plain"),
        }
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        self._server = await asyncio.start_server(self._handle, host, port)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5.0):  # not wait_for: see gpusched_common.relay's _pump
                head = await reader.readuntil(b"\r\n\r\n")
            method, path, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            route = self._routes.get(path)
            if method != "GET" or (route is None and path != "/metrics"):
                body, status, ctype = b"not found\n", "404 Not Found", "text/plain"
            elif path == "/metrics":
                # rendering thousands of series takes a while: keep the event loop (telemetry) running
                body, ctype, status = await asyncio.to_thread(self._exporter.render), CONTENT_TYPE, "200 OK"
            else:
                assert route is not None
                (body, ctype), status = route(), "200 OK"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         "Connection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ValueError,
                ConnectionError):
            pass
        except Exception:  # noqa: BLE001 - a failing scrape must not take the service down
            log.exception("metrics endpoint failed")
        finally:
            writer.close()
