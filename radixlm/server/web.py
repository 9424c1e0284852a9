"""The built-in web page (``GET /``: playground, live radix-cache view, vital signs) and the
read-only routes behind its cache view. The page is static files shipped in the package
(``server/static/``, no build step); it talks only to the server's own routes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from radixlm.server.errors import ERROR_RESPONSES
from radixlm.server.state import ServerState, server_state
from radixlm.server.streams import sse, sse_response

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
MAX_TREE_NODES = 2000
TOKEN_MASK = (1 << 32) - 1  # NOTE: a salted tree key is the token id plus a multiple of 2**32

router = APIRouter(tags=["web"], responses=ERROR_RESPONSES)
static = StaticFiles(directory=STATIC_DIR)


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(os.path.join(STATIC_DIR, "index.html"))


@router.get("/cache/tree")
async def cache_tree(
    request: Request, max_nodes: int = Query(200, ge=1, le=MAX_TREE_NODES)
) -> dict[str, Any]:
    """The radix tree's first ``max_nodes`` nodes, breadth first (``truncated`` when it has
    more), each with its token count, lock count, recency and the text of its first tokens;
    and the KV pool's totals. It shows prompt text: with an API key set, it needs the key."""
    return await _tree(server_state(request), max_nodes)


@router.get("/cache/tree/stream", responses={200: {"content": {"text/event-stream": {}}}})
async def cache_tree_stream(
    request: Request,
    max_nodes: int = Query(200, ge=1, le=MAX_TREE_NODES),
    interval: float = Query(1.0, ge=0.2, le=60.0),
) -> Any:
    """``/cache/tree`` as server-sent events: a frame whenever the tree changed, checked every
    ``interval`` seconds."""
    state = server_state(request)

    async def frames() -> AsyncIterator[str]:
        last = None
        while True:
            view = await _tree(state, max_nodes)
            mark = (view["clock"], view["free_tokens"], len(view["nodes"]))
            if mark != last:
                last = mark
                yield sse(view)
            await asyncio.sleep(interval)

    return await sse_response(request, frames())


async def _tree(state: ServerState, max_nodes: int) -> dict[str, Any]:
    # NOTE: one node more than asked for tells whether the tree has more
    out = await state.runtime.manager.control("tree", data={"max_nodes": max_nodes + 1})
    data = dict(out.data)
    nodes = data.pop("nodes")
    data["truncated"] = len(nodes) > max_nodes + 1  # the root and max_nodes + 1 nodes
    data["nodes"] = [_node(state, n, data["clock"]) for n in nodes[: max_nodes + 1]]
    return data


def _node(state: ServerState, node: dict[str, Any], clock: int) -> dict[str, Any]:
    head = node["head"]
    salted = any(t > TOKEN_MASK for t in head)
    ids = [t & TOKEN_MASK for t in head]
    text = state.tokenizer.decode(ids) if state.tokenizer is not None else None
    return {
        "id": node["id"],
        "parent": node["parent"],
        "tokens": node["tokens"],
        "text": text,
        "ids": ids,
        "lock_ref": node["lock_ref"],
        "age": clock - node["last_access"],
        "salted": salted,
    }
