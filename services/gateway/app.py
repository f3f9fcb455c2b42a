"""Gateway service: the HTTP front door (FastAPI). ``create_app(settings)`` builds everything from
settings; the database pool is opened in the lifespan (``open_resources``/``close_resources`` for a
caller that drives the app without a server), nothing at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpusched_common import events as ev
from gpusched_common.db import create_pool
from gpusched_common.oidc import OidcConfig, OidcVerifier
from gpusched_common.producers import read_key_file
from gpusched_common.gpu_catalogue import read_catalogue
from gpusched_common.stores.gpu_models import ModelReader
from gpusched_common.stores.tenancy import TenancyReader
from gpusched_common.tasks import cancel_and_wait
from gpusched_core.rates import RateLimit

from services.gateway import control, estimates, handlers, logs, store, stream, submissions, views
from services.gateway import check, whatif
from services.gateway.dashboard import oidc_login
from services.gateway.dashboard import routes as dashboard_routes
from services.gateway.auth import AuthFailures, Problem, problem_response
from services.gateway.publisher import SubmissionPublisher
from services.gateway.ratelimit import PrincipalLimiter
from services.gateway.settings import GatewaySettings

log = logging.getLogger(__name__)


def _oidc(settings: GatewaySettings) -> OidcVerifier | None:
    if not (settings.oidc_issuer and settings.oidc_audience):
        return None
    return OidcVerifier(OidcConfig(issuer=settings.oidc_issuer, audience=settings.oidc_audience,
                                   jwks_url=settings.oidc_jwks_url, subject_claim=settings.oidc_subject_claim,
                                   tenant_claim=settings.oidc_tenant_claim, role_claim=settings.oidc_role_claim))


def _publisher(settings: GatewaySettings) -> SubmissionPublisher:
    key = None
    if settings.gateway_producer_key_file is not None:
        key = read_key_file(settings.gateway_producer_key_file)
        if key is None:
            raise ValueError(f"{settings.gateway_producer_key_file} holds no producer key (gsk_...): "
                             "create one with `gpusched gateway-init` or `gpusched producers create --attests`")
    else:
        log.warning("GPUSCHED_GATEWAY_PRODUCER_KEY_FILE is not set: submissions are answered with 503")
    return SubmissionPublisher(settings, key, timeout_s=settings.gateway_publish_timeout_s,
                               republish_s=settings.outbox_republish_s)


async def open_resources(app: FastAPI) -> None:
    settings: GatewaySettings = app.state.settings
    # its own role where one is set (migration 017: reads only); min_size 0: the gateway starts (and /readyz
    # says 503) while the database is unreachable
    app.state.publisher = _publisher(settings)
    app.state.oidc = _oidc(settings)
    app.state.tenancy = TenancyReader()
    app.state.models = ModelReader(read_catalogue(settings.gpu_catalogue))  # the GPU models admission accepts
    app.state.pool = await create_pool(settings.gateway_database_url or settings.database_url, min_size=0,
                                       max_size=settings.gateway_pool_max_size)
    app.state.publisher.recorded = lambda job_ids: store.recorded_job_ids(app.state.pool, job_ids)
    app.state.forgetting = asyncio.get_running_loop().create_task(app.state.publisher.forget_recorded_forever(),
                                                                  name="gateway-forget-recorded")
    app.state.change_feed = stream.ChangeFeed(app.state.pool, poll_s=settings.gateway_stream_poll_s)


async def close_resources(app: FastAPI) -> None:
    await cancel_and_wait([app.state.forgetting], what="the gateway's forgetting of recorded submissions")
    await app.state.change_feed.close()
    await app.state.publisher.stop()
    if app.state.oidc is not None:
        await app.state.oidc.close()
    await app.state.pool.close()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    await open_resources(app)
    try:
        yield
    finally:
        await close_resources(app)


def create_app(settings: GatewaySettings) -> FastAPI:
    app = FastAPI(title="gpusched gateway", version="1", lifespan=_lifespan,
                  description="Submit and read jobs, the queue, tenants' quota and nodes (bearer tokens: API "
                              "tokens or OIDC JWTs; RFC 9457 errors).")
    app.state.settings = settings
    app.state.auth_failures = AuthFailures()
    app.state.limiter = PrincipalLimiter({
        "submit": RateLimit(settings.gateway_submit_rate_per_s, settings.gateway_submit_burst),
        "read": RateLimit(settings.gateway_read_rate_per_s, settings.gateway_read_burst),
        "signin": RateLimit(settings.gateway_signin_rate_per_s, settings.gateway_signin_burst)})
    app.include_router(handlers.router)
    app.include_router(submissions.router)
    app.include_router(check.router)
    app.include_router(control.router)
    app.include_router(logs.router)
    app.include_router(views.router)
    app.include_router(estimates.router)
    app.include_router(whatif.router)
    app.include_router(stream.router)
    app.include_router(oidc_login.router)
    app.include_router(dashboard_routes.router)  # last: its /ui/{path} answers every other dashboard path
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_exception_handler(Problem, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(RequestValidationError, _on_invalid)
    app.add_middleware(LimitsMiddleware, max_body_bytes=settings.gateway_max_body_bytes,
                       timeout_s=settings.gateway_read_timeout_s,
                       slow_paths={whatif.PATH: settings.gateway_whatif_timeout_s + 5})  # it answers its own 504
    return app


def _openapi(app: FastAPI) -> dict:
    """FastAPI's schema, with the JobSpec the submission routes take (they read the body themselves, to
    take YAML too) among its components."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        spec = ev.JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(spec.pop("$defs", {}))
        components["JobSpec"] = spec
        app.openapi_schema = schema
    return app.openapi_schema


async def _on_problem(request: Request, exc: Exception) -> object:
    assert isinstance(exc, Problem)
    return problem_response(exc.status, exc.detail, exc.headers, **exc.extensions)


async def _on_http_error(request: Request, exc: Exception) -> object:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    return problem_response(exc.status_code, detail, dict(exc.headers or {}))


async def _on_invalid(request: Request, exc: Exception) -> object:
    assert isinstance(exc, RequestValidationError)
    detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
    return problem_response(422, detail)


class LimitsMiddleware:
    """Refuses a body over ``max_body_bytes`` (413, by its Content-Length or as it streams in) and answers
    504 to a request still unanswered after ``timeout_s`` (the paths of ``slow_paths``: after theirs): a slow
    or huge request holds no worker."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, timeout_s: float,
                 slow_paths: dict[str, float] | None = None) -> None:
        self.app, self.max_body_bytes, self.timeout_s = app, max_body_bytes, timeout_s
        self.slow_paths = slow_paths or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not declared.isdigit():
            return await _send_problem(send, 400, "the Content-Length header is not a number")
        if int(declared) > self.max_body_bytes:
            return await _send_problem(send, 413, f"request bodies are limited to {self.max_body_bytes} bytes")
        started, seen = False, 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body_bytes:
                raise Problem(413, f"request bodies are limited to {self.max_body_bytes} bytes")
            return message

        deadline: asyncio.Timeout | None = None

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                if deadline is not None:
                    deadline.reschedule(None)  # answered in time: a stream (a followed job) may go on
            await send(message)

        timeout_s = self.slow_paths.get(scope.get("path", ""), self.timeout_s)
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                await self.app(scope, limited_receive, tracking_send)
        except TimeoutError:
            if not started:
                await _send_problem(send, 504, f"the request took longer than {timeout_s}s")


async def _send_problem(send: Send, status: int, detail: str) -> None:
    response = problem_response(status, detail)
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})
