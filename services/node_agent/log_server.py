"""The agent's log server: the gateway reads a job's output here (``GET /logs/{node_id}/{job_id}?offset=&limit=``),
so a user needs no access to the node. Only the gateway may ask: each request is signed with the gateway's
producer key and checked against its public key (``GPUSCHED_AGENT_GATEWAY_PUBLIC_KEY``) and the time it was
signed (``gpusched_common.producers.check_request``). One server per agent process serves every agent of a
fleet. Without the gateway's key no server runs, and the node registers no log URL."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpusched_common.ids import is_valid_id
from gpusched_common.producers import check_request
from gpusched_core.agent.retention import DEFAULT_LOG_RETENTION_S
from gpusched_core.durations import format_duration

log = logging.getLogger(__name__)
MAX_CHUNK_BYTES = 1024 * 1024


def log_app(public_key: str, log_paths: Mapping[str, Callable[[str], Path]],
            clock: Callable[[], float] = time.time, retention_s: float = DEFAULT_LOG_RETENTION_S) -> Starlette:
    """``log_paths``: for each node this process runs, where a job's log is; ``retention_s``: how long the
    output of an ended job is kept (said in the answer for one that is gone)."""

    async def read_log(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        refused = check_request(public_key, "GET", target, dict(request.headers), clock())
        if refused is not None:
            return JSONResponse({"detail": refused}, status_code=401)
        node_id, job_id = request.path_params["node_id"], request.path_params["job_id"]
        if node_id not in log_paths or not is_valid_id(job_id):
            return JSONResponse({"detail": f"no node {node_id} here"}, status_code=404)
        try:
            offset = max(0, int(request.query_params.get("offset", "0")))
            limit = min(MAX_CHUNK_BYTES, max(1, int(request.query_params.get("limit", str(MAX_CHUNK_BYTES)))))
        except ValueError:
            return JSONResponse({"detail": "offset and limit are whole numbers"}, status_code=400)
        path = log_paths[node_id](job_id)
        try:
            with path.open("rb") as f:
                size = f.seek(0, 2)
                f.seek(min(offset, size))
                chunk = f.read(limit)
        except FileNotFoundError:
            return JSONResponse({"detail": f"no log of job {job_id} on {node_id} (the output of an ended job is "
                                           f"kept {format_duration(retention_s)} after its last write)"},
                                status_code=404)
        return Response(chunk, media_type="application/octet-stream",
                        headers={"X-Log-Size": str(size), "X-Log-Next-Offset": str(min(offset, size) + len(chunk))})

    return Starlette(routes=[Route("/logs/{node_id}/{job_id}", read_log)])


class LogServer:
    """Bound at construction (so the URL is known before the agents register), served by ``run``."""

    def __init__(self, app: Starlette, host: str, port: int, advertised: str | None = None) -> None:
        self._socket = socket.create_server((host, port))
        bound = self._socket.getsockname()[1]
        self.url = advertised or f"http://{host}:{bound}"
        # no lifespan: the app has no start-up or shut-down of its own, and uvicorn's lifespan task would print
        # a traceback when the agent's stop cancels the server
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))

    async def run(self) -> None:
        log.info("serving job logs for the gateway at %s", self.url)
        try:
            await self._server.serve(sockets=[self._socket])
        except asyncio.CancelledError:
            self._server.should_exit = True
            raise
