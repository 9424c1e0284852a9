"""Native routes: /generate (the Engine's shapes), health, info, cache, metrics."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from radixlm.runtime.io_struct import GenerateInput, SingleRequest
from radixlm.runtime.runtime import Delta
from radixlm.runtime.tokenizer_manager import EngineDeadError, SchedulerTimeoutError, check_text
from radixlm.server.errors import (
    ERROR_RESPONSES,
    STREAM_RESPONSE,
    APIError,
    error_response,
)
from radixlm.server.protocol import (
    AbortRequest,
    CacheSaveRequest,
    FlushCacheRequest,
    GenerateRequest,
)
from radixlm.server.state import ServerState, server_state, tenant_salt
from radixlm.server.streams import (
    DONE_FRAME,
    collect,
    generate_chunks,
    race_disconnect,
    sse,
    sse_response,
)

router = APIRouter(tags=["native"], responses=ERROR_RESPONSES)
HEALTH_TIMEOUT_S = 30.0
READY_PING_S = 5.0  # a scheduler that answers no ping within this is not ready


@router.post("/generate", responses=STREAM_RESPONSE)
async def generate(body: GenerateRequest, request: Request) -> Any:
    """Generate for one prompt or a batch; with ``stream``, SSE frames carrying the text so far
    (and ``index`` when there are several prompts or samples), ending with ``data: [DONE]``."""
    state = server_state(request)
    obj = GenerateInput(**body.model_dump())
    obj.cache_salt = tenant_salt(request, obj.cache_salt)
    reqs = obj.split()
    if obj.stream:
        return await sse_response(request, _frames(state, reqs))
    results = await race_disconnect(request, collect(state.runtime, reqs))
    return results if obj.is_batch or len(results) > 1 else results[0]


async def _frames(state: ServerState, reqs: list[SingleRequest]) -> AsyncIterator[str]:
    several = len(reqs) > 1
    deltas = [Delta() for _ in reqs] if state.args.incremental_streaming_output else None
    async for i, chunk in generate_chunks(state.runtime, reqs):
        if deltas is not None:
            chunk = deltas[i](chunk)
        yield sse({**chunk, "index": i} if several else chunk)
    yield DONE_FRAME


def _not_alive(request: Request) -> Response | None:
    """A 503 while the server starts or after its engine died; None while it is alive."""
    state = getattr(request.app.state, "server", None)
    if state is None:
        return error_response(503, "the server is starting")
    if not state.runtime.alive:
        reason = state.runtime.manager.dead or state.runtime.backend.dead_reason()
        return error_response(503, f"the engine is not running: {reason}")
    return None


@router.get("/health")
async def health(request: Request) -> Response:
    """200 while the scheduler and detokenizer processes are alive, else 503."""
    return _not_alive(request) or JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: 200 when the model is loaded, the scheduler answers a ping within
    ``READY_PING_S`` and the queue has room; else 503 saying which is not the case."""
    if (dead := _not_alive(request)) is not None:
        return dead
    state = server_state(request)
    if state.runtime.manager.is_full:
        return error_response(503, "the request queue is full", code="queue_full")
    try:
        await state.runtime.manager.control("ping", timeout=READY_PING_S)
    except (EngineDeadError, SchedulerTimeoutError) as e:
        return error_response(503, str(e), code="scheduler_timeout")
    return JSONResponse({"status": "ok"})


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """200 once a one-token generation went through the whole pipeline, else 503."""
    state = server_state(request)
    probe = GenerateInput(
        input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        rid=f"health-{uuid.uuid4().hex}",
    )
    try:
        await asyncio.wait_for(collect(state.runtime, probe.split()), HEALTH_TIMEOUT_S)
    except (EngineDeadError, asyncio.TimeoutError) as e:
        return error_response(503, f"generation failed: {type(e).__name__}: {e}")
    return JSONResponse({"status": "ok"})


@router.get("/get_model_info")
async def get_model_info(request: Request) -> dict[str, Any]:
    state = server_state(request)
    return {
        "model_path": state.model_path,
        "tokenizer_path": state.args.tokenizer_path or state.model_path,
        "is_generation": True,
        "served_model_name": state.served_model_name,
        "context_length": state.context_len,
        "chat_template": state.chat_template or getattr(state.tokenizer, "chat_template", None),
        "bos_token": getattr(state.tokenizer, "bos_token", None),
        "eos_token": getattr(state.tokenizer, "eos_token", None),
    }


@router.get("/get_server_info")
async def get_server_info(request: Request) -> dict[str, Any]:
    """The server's arguments, the model's limits, live scheduler stats and the requests the
    tokenizer manager holds (``requests_in_flight``)."""
    state = server_state(request)
    info = await state.runtime.server_info()
    in_flight = len(state.runtime.manager.states)
    return {**info, "served_model_name": state.served_model_name, "requests_in_flight": in_flight}


FLUSH_BODY = {  # NOTE: an optional body: a bare POST (SGLang's clients send none) flushes memory
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": FlushCacheRequest.model_json_schema()}},
    }
}


@router.post("/flush_cache", openapi_extra=FLUSH_BODY)
async def flush_cache(request: Request) -> dict[str, Any]:
    """Empty the radix cache (``{"tiers": ["memory", "disk"]}``: the disk tier too); the memory
    tier is refused (409) while requests run."""
    raw = (await request.body()).strip()
    try:
        body = FlushCacheRequest.model_validate_json(raw) if raw else FlushCacheRequest()
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None
    tiers = body.tiers
    if not await server_state(request).runtime.flush_cache(tuple(tiers)):
        raise APIError(409, "cannot flush the cache while requests are running")
    return {"success": True, "tiers": tiers}


@router.post("/cache/save")
async def cache_save(body: CacheSaveRequest, request: Request) -> dict[str, Any]:
    """Compute a prefix and pin its blocks in the disk tier: the LRU budget never removes them
    (a disk flush does); returns how many of its tokens are pinned (whole blocks)."""
    state = server_state(request)
    if state.args.kv_disk_cache is None:
        raise APIError(400, "POST /cache/save needs the disk tier: start the server with "
                       "--kv-disk-cache DIR", param="kv_disk_cache")  # fmt: skip
    salt = tenant_salt(request, body.cache_salt)
    obj = GenerateInput(body.text, body.input_ids, {"max_new_tokens": 0}, cache_salt=salt)
    (req,) = obj.split()
    if req.text is not None:
        check_text("text", req.text)
    result = await state.runtime.manager.generate_one(req)
    ids = req.input_ids if req.input_ids is not None else state.tokenizer.encode(req.text)
    out = await state.runtime.manager.control(
        "pin_prefix", data={"input_ids": ids, "cache_salt": salt}
    )
    if not out.ok:
        raise APIError(400, out.data["message"], param="kv_disk_cache")
    return {
        "success": True,
        "prompt_tokens": result["meta_info"]["prompt_tokens"],
        "pinned_tokens": out.data["pinned_tokens"],
    }


@router.post("/abort_request")
async def abort_request(body: AbortRequest, request: Request) -> dict[str, Any]:
    """Abort a request (and its samples ``rid-0``, ``rid-1``, ...) or every request in flight."""
    manager = server_state(request).runtime.manager
    if body.rid is None and not body.abort_all:
        raise APIError(400, "give rid or abort_all", param="rid")
    targets = list(manager.states) if body.abort_all else [body.rid]
    rids = [rid for target in targets for rid in manager.abort(target)]
    return {"success": True, "aborted": rids}


@router.get("/metrics", responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(request: Request) -> Response:
    """Prometheus metrics (scheduler stats are read at scrape time)."""
    state = server_state(request)
    try:
        stats = (await state.runtime.manager.control("stats", timeout=5.0)).data
    except (EngineDeadError, SchedulerTimeoutError):
        stats = None
    return Response(state.metrics.render(stats), media_type=CONTENT_TYPE_LATEST)
