"""``GET /v1/jobs/{id}/logs``: a job's output, read from the agent of the node it ran on (``rank`` picks a
gang member's node), so a user needs no access to the node. The gateway signs each request to the agent with
its producer key (the agent knows only the gateway's public key: nobody else may read logs there). With
``follow=true`` the output streams as it is written, until the job has ended and all of it was sent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from gpusched_common.stores import jobs as history
from gpusched_common.stores.cluster import node_log_urls
from gpusched_core.access import Action

from services.gateway import store
from services.gateway.auth import Caller, Problem, acts, within_rate
from services.gateway.control import FINISHED
from services.gateway.handlers import visible_job

router = APIRouter()
CHUNK_BYTES = 256 * 1024


def run_nodes(events: list[dict[str, Any]]) -> list[str]:
    """The nodes of the job's latest run, by rank (empty: it never ran)."""
    placed = [e["payload"] for e in events if e["type"] == "JobPlaced"]
    if not placed:
        return []
    members = placed[-1].get("members") or []
    return [m["node_id"] for m in sorted(members, key=lambda m: m["rank"])] or [placed[-1]["node_id"]]


@router.get("/v1/jobs/{job_id}/logs", openapi_extra=acts(Action.JOB_LOGS), response_model=None)
async def job_logs(request: Request, principal: Caller, job_id: str, rank: Annotated[int, Query(ge=0)] = 0,
                   offset: Annotated[int, Query(ge=0)] = 0, follow: bool = False) -> Response:
    """The job's stdout and stderr from byte ``offset`` (``X-Log-Next-Offset`` says where to go on)."""
    within_rate(request, principal, "read")
    async with request.app.state.pool.acquire() as conn:
        job = await visible_job(conn, principal, Action.JOB_LOGS, job_id)
        nodes = run_nodes(await history.job_history(conn, job_id))
        if not nodes:
            raise Problem(404, f"job {job_id} has not run yet (it is {job['state']}): no log")
        if rank >= len(nodes):
            raise Problem(404, f"job {job_id} ran on {len(nodes)} node(s): rank is 0..{len(nodes) - 1}")
        url = (await node_log_urls(conn, [nodes[rank]])).get(nodes[rank])
    if url is None:
        raise Problem(503, f"node {nodes[rank]} serves no logs (its agent was not given the gateway's key)")
    source = _AgentLog(request, url, nodes[rank], job_id)
    if not follow:
        chunk, next_offset = await source.read(offset)
        return Response(chunk, media_type="text/plain; charset=utf-8", headers={"X-Log-Next-Offset": str(next_offset)})
    return StreamingResponse(_follow(request, source, job_id, offset), media_type="text/plain; charset=utf-8",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _AgentLog:
    def __init__(self, request: Request, url: str, node_id: str, job_id: str) -> None:
        self._request, self._url, self._path = request, url.rstrip("/"), f"/logs/{node_id}/{job_id}"
        self._node = node_id

    async def read(self, offset: int) -> tuple[bytes, int]:
        key = self._request.app.state.publisher.key
        if key is None:
            raise Problem(503, "this gateway has no producer key: it cannot ask agents for logs")
        target = f"{self._path}?offset={offset}&limit={CHUNK_BYTES}"
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                answer = await client.get(self._url + target, headers=key.request_headers("GET", target, time.time()))
        except httpx.HTTPError as exc:
            raise Problem(503, f"the agent of {self._node} did not answer ({type(exc).__name__})") from None
        if answer.status_code == 404:
            return b"", offset  # not written yet (or gone with the node's work directory)
        if answer.status_code != 200:
            raise Problem(502, f"the agent of {self._node} refused the log request (HTTP {answer.status_code})")
        return answer.content, int(answer.headers.get("x-log-next-offset", offset + len(answer.content)))


async def _follow(request: Request, source: _AgentLog, job_id: str, offset: int) -> AsyncIterator[bytes]:
    settings = request.app.state.settings
    deadline = asyncio.get_running_loop().time() + settings.gateway_follow_max_s
    while asyncio.get_running_loop().time() < deadline and not await request.is_disconnected():
        chunk, offset = await source.read(offset)
        if chunk:
            yield chunk
            continue
        async with request.app.state.pool.acquire() as conn:
            state = (await store.job_states(conn, [job_id])).get(job_id)
        if state in FINISHED:  # ended, and nothing more was written: one last read for what came meanwhile
            chunk, offset = await source.read(offset)
            if chunk:
                yield chunk
            return
        await asyncio.sleep(settings.gateway_follow_poll_s)
