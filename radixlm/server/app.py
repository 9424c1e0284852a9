"""The FastAPI application: starts the runtime in its lifespan and serves both APIs."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from radixlm.runtime.config import ServerArgs
from radixlm.runtime.launcher import Backend, launch
from radixlm.runtime.loader.gguf_loader import release_gguf
from radixlm.runtime.runtime import Runtime
from radixlm.server import native, openai_api
from radixlm.server.body_limit import BodyLimitMiddleware
from radixlm.server.errors import error_response, install_handlers
from radixlm.server.metrics import ServerMetrics
from radixlm.server.openai_format import load_chat_template
from radixlm.server.state import ServerState, served_name
from radixlm.server.streams import ClientDisconnected

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/health", "/health_generate", "/ready"})  # NOTE: probes carry no key
DEAD_GRACE_S = 3.0  # keep answering (503) this long after the engine died, then exit


def create_app(
    args: ServerArgs,
    on_fatal: Callable[[str], None] | None = None,
    backend: Backend | None = None,
) -> FastAPI:
    """The app for ``args``. ``on_fatal(reason)`` is called if the engine's processes die.
    ``backend``: processes already launched for ``args`` (else the app's start-up launches
    them)."""
    chat_template = load_chat_template(args.chat_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal backend
        if backend is None:
            backend = await asyncio.get_running_loop().run_in_executor(None, launch, args)
        runtime = Runtime.start(args, backend)
        release_gguf()  # NOTE: the server needs nothing more from the model file
        name = served_name(args, backend.info["model_path"])
        state = ServerState(args, runtime, ServerMetrics(name), name, chat_template)
        runtime.manager.on_timing = state.metrics.observe
        app.state.server = state
        watch = asyncio.create_task(_watch_engine(runtime, on_fatal))
        try:
            yield
        finally:
            watch.cancel()
            await runtime.close()

    app = FastAPI(title="radixlm", version="0.1.0", lifespan=lifespan)
    app.state.server = None
    install_handlers(app)
    app.add_exception_handler(ClientDisconnected, _client_gone)
    app.include_router(native.router)
    app.include_router(openai_api.router)
    app.add_middleware(JSONBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_bytes)
    if args.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=args.api_key)
    return app


def abort_in_flight(app: FastAPI) -> int:
    """Abort every request in flight (at shutdown, so that open streams end at once)."""
    state: ServerState | None = app.state.server
    if state is None or state.runtime.manager.dead:
        return 0
    rids = list(state.runtime.manager.states)
    for rid in rids:
        state.runtime.manager.abort(rid)
    return len(rids)


async def _client_gone(_: Request, __: Exception) -> Response:
    return Response(status_code=499)


async def _watch_engine(runtime: Runtime, on_fatal: Callable[[str], None] | None) -> None:
    while runtime.alive:
        await asyncio.sleep(0.25)
    reason = runtime.manager.dead or runtime.backend.dead_reason() or "unknown"
    logger.error("the engine died (%s); shutting the server down in %.0f s", reason, DEAD_GRACE_S)
    await asyncio.sleep(DEAD_GRACE_S)
    if on_fatal is not None:
        on_fatal(reason)


class APIKeyMiddleware:
    """Require ``Authorization: Bearer <key>`` on every route but the health checks."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(401, "missing or invalid API key", code="invalid_api_key")
        await response(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        return hmac.compare_digest(given, self.expected)


class JSONBodyMiddleware:
    """Read every POST body as JSON, whatever its Content-Type (curl -d sends a form type)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
