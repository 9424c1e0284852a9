"""Running requests for HTTP: fan-out over prompts and samples, SSE frames, client disconnects.

A request whose client goes away is cancelled; cancelling the tokenizer manager's generator
sends the abort to the scheduler, which frees the request's KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse

from radixlm.runtime.io_struct import SingleRequest
from radixlm.runtime.runtime import Runtime
from radixlm.server.errors import APIError, error_body, to_api_error

T = TypeVar("T")
DONE_FRAME = "data: [DONE]\n\n"


class ClientDisconnected(Exception):
    """The HTTP client went away before its response was complete."""


def sse(payload: Any) -> str:
    """One server-sent-events frame."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def wait_disconnect(request: Request) -> None:
    """Return once the client has disconnected (the body must already be read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it and raise ClientDisconnected if the client goes first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise ClientDisconnected()
        return task.result()
    finally:
        for t in (task, watcher):
            t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)


async def until_disconnect(request: Request, items: AsyncIterator[T]) -> AsyncIterator[T]:
    """Iterate ``items`` while the client is connected. When it goes away, stop quietly;
    either way ``items`` is closed, which aborts the work behind it."""
    watcher = asyncio.ensure_future(wait_disconnect(request))
    nxt: asyncio.Future | None = None
    try:
        while True:
            nxt = asyncio.ensure_future(anext(items))
            await asyncio.wait({nxt, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not nxt.done():
                return
            try:
                item = nxt.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        watcher.cancel()
        if nxt is not None and not nxt.done():
            nxt.cancel()  # NOTE: cancelling the pending step closes ``items`` mid-await
        else:
            await items.aclose()


async def merge(iterators: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several iterators as ``(index, item)`` in arrival order. The first error raised
    by any of them is raised here; closing the merge cancels them all."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for item in it:
                queue.put_nowait((i, item))
            queue.put_nowait((i, end))
        except Exception as e:  # noqa: BLE001  (re-raised by the consumer)
            queue.put_nowait((i, e))

    tasks = [asyncio.ensure_future(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def error_frames(err: APIError) -> list[str]:
    """The end of a stream that failed: OpenAI's error body, then ``[DONE]``."""
    return [sse(error_body(err.status, err.message, err.param, err.code)), DONE_FRAME]


async def sse_response(
    request: Request,
    frames: AsyncIterator[str],
    on_error: Callable[[APIError], list[str]] = error_frames,
) -> StreamingResponse:
    """Stream ``frames`` as server-sent events. The first frame is awaited before answering, so
    bad input still gets its HTTP error status; a later failure ends the stream with
    ``on_error``'s frames."""
    first = await race_disconnect(request, anext(frames))

    async def body() -> AsyncIterator[str]:
        yield first
        try:
            async for frame in until_disconnect(request, frames):
                yield frame
        except Exception as e:  # noqa: BLE001  (reported to the client in the stream)
            for frame in on_error(to_api_error(e)):
                yield frame

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


def generate_chunks(runtime: Runtime, reqs: list[SingleRequest]) -> AsyncIterator[tuple[int, dict]]:
    """``(index, response so far)`` for every update of every request (text cumulative)."""
    return merge([runtime.manager.generate(r) for r in reqs])


async def collect(runtime: Runtime, reqs: list[SingleRequest]) -> list[dict]:
    """The final response of each request, in order."""
    results: list[dict | None] = [None] * len(reqs)
    chunks = generate_chunks(runtime, reqs)
    try:
        async for i, chunk in chunks:
            results[i] = chunk
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()
    return results  # type: ignore[return-value]
