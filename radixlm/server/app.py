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
from radixlm.server import (
    embeddings,
    lora_routes,
    native,
    openai_api,
    responses_api,
    scores,
    tokenizer_routes,
    web,
)
from radixlm.server.body_limit import BodyLimitMiddleware
from radixlm.server.errors import error_response, install_handlers
from radixlm.server.lenient import IgnoredFieldsHeader
from radixlm.server.metrics import ServerMetrics
from radixlm.server.openai_format import load_chat_template
from radixlm.server.state import ServerState, served_name
from radixlm.server.streams import ClientDisconnected

logger = logging.getLogger(__name__)

# NOTE: probes carry no key; the page's files neither (the page asks for the key)
OPEN_PATHS = frozenset({"/health", "/health_generate", "/ready", "/"})
OPEN_PREFIXES = ("/static/",)
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
    app.include_router(tokenizer_routes.router)
    app.include_router(lora_routes.router)
    app.include_router(openai_api.router)
    app.include_router(embeddings.router)
    app.include_router(scores.router)
    app.include_router(responses_api.router)
    app.include_router(web.router)
    app.mount("/static", web.static, name="static")
    app.add_middleware(IgnoredFieldsHeader)
    app.add_middleware(JSONBodyMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_bytes)
    keys = api_keys(args)
    if keys:
        app.add_middleware(APIKeyMiddleware, keys=keys)
    return app


def api_keys(args: ServerArgs) -> dict[str, str | None]:
    """Accepted API keys -> their tenant (None for ``--api-key``); ValueError for a bad
    ``--api-keys-file``."""
    keys: dict[str, str | None] = {args.api_key: None} if args.api_key else {}
    if args.api_keys_file is None:
        return keys
    try:
        with open(args.api_keys_file) as f:
            lines = [line.split() for line in f]
    except OSError as e:
        raise ValueError(f"api_keys_file {args.api_keys_file!r}: {e.strerror}") from None
    for number, parts in enumerate(lines, 1):
        if len(parts) > 2:
            raise ValueError(f"api_keys_file line {number}: expected 'KEY [TENANT]'")
        if parts:
            keys[parts[0]] = parts[1] if len(parts) == 2 else f"tenant-{number}"
    if len(keys) == (1 if args.api_key else 0):
        raise ValueError(f"api_keys_file {args.api_keys_file!r} holds no key")
    return keys


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
    """Require ``Authorization: Bearer <key>`` on every route but the health checks; a key's
    tenant (``--api-keys-file``) goes to ``request.state.tenant``."""

    def __init__(self, app: ASGIApp, keys: dict[str, str | None]) -> None:
        self.app = app
        self.keys = [(f"Bearer {key}".encode(), tenant) for key, tenant in keys.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        # NOTE: every key is compared (in constant time), so the time does not tell which
        matches = [tenant for key, tenant in self.keys if hmac.compare_digest(given, key)]
        if not matches:
            response = error_response(401, "missing or invalid API key", code="invalid_api_key")
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = matches[0]
        await self.app(scope, receive, send)


class JSONBodyMiddleware:
    """Read every POST body as JSON, whatever its Content-Type (curl -d sends a form type)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)
