"""Embedding routes: ``/v1/embeddings`` (OpenAI's shape) and ``/encode`` (SGLang's).

Each input is one prefill-only request through the scheduler, batched with everything else
that runs; its vector is the pooled final hidden state (``runtime/scheduler/pooling.py``).
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from fastapi import APIRouter, Request

from radixlm.runtime.io_struct import EncodeInput
from radixlm.server import openai_format as fmt
from radixlm.server.errors import ERROR_RESPONSES, APIError
from radixlm.server.lenient import check_fields
from radixlm.server.protocol import EmbeddingRequest, EncodeRequest
from radixlm.server.state import server_state, tenant_salt
from radixlm.server.streams import collect, race_disconnect

router = APIRouter(tags=["embeddings"], responses=ERROR_RESPONSES)


@router.post("/encode")
async def encode(body: EncodeRequest, request: Request) -> Any:
    """``{"embedding": [...], "meta_info": {...}}`` for one input, a list of them for a batch."""
    obj = EncodeInput(**body.model_dump())
    return await _embed(request, obj)


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request) -> dict[str, Any]:
    """OpenAI's embeddings: ``data`` in input order, floats or base64 float32 bytes."""
    check_fields(request, body)
    state = server_state(request)
    try:
        lora = state.check_model(body.model)
        obj = _encode_input(body, lora)
        hidden = state.runtime.backend.info["hidden_size"]
        if body.dimensions is not None and body.dimensions != hidden:
            raise ValueError(f"dimensions: this model's embeddings have {hidden} dimensions "
                             "and cannot be shortened; leave dimensions out")  # fmt: skip
        results = await _embed(request, obj)
    except ValueError as e:
        raise APIError(400, *fmt.openai_message(str(e))) from None
    results = results if isinstance(results, list) else [results]
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(r["embedding"], body.encoding_format)}
            for i, r in enumerate(results)]  # fmt: skip
    return {
        "object": "list",
        "data": data,
        "model": lora or state.served_model_name,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _encode_input(body: EmbeddingRequest, lora: str | None) -> EncodeInput:
    items = body.input
    if items == "" or items == []:
        raise ValueError("input must not be empty")
    text = ids = None
    if isinstance(items, str) or isinstance(items[0], str):
        text = items
        empty = next((i for i, t in enumerate(items) if t == ""), None)
        if isinstance(items, list) and empty is not None:
            raise ValueError(f"input[{empty}] is an empty string")
    else:
        ids = items
        empty = next((i for i, t in enumerate(items) if t == []), None)
        if isinstance(items[0], list) and empty is not None:
            raise ValueError(f"input[{empty}] is an empty list of token ids")
    return EncodeInput(text, ids, body.pooling, body.normalize, cache_salt=body.cache_salt,
                       lora_path=lora)  # fmt: skip


async def _embed(request: Request, obj: EncodeInput) -> dict | list[dict]:
    state = server_state(request)
    obj.cache_salt = tenant_salt(request, obj.cache_salt)
    reqs = obj.split()
    results = await race_disconnect(request, collect(state.runtime, reqs))
    return results if obj.is_batch or len(results) > 1 else results[0]


def _encoded(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    # NOTE: OpenAI's base64 is the little-endian float32 bytes (the SDK decodes it that way)
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
