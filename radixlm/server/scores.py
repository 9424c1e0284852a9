"""``POST /v1/score`` (SGLang's): per item, the probabilities of some label tokens coming next
after ``query + item`` (``runtime/scoring.py``), e.g. a classifier's yes/no from a chat model."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from radixlm.runtime.scoring import ScoreInput
from radixlm.server import openai_format as fmt
from radixlm.server.errors import ERROR_RESPONSES, error_body
from radixlm.server.lenient import check_fields
from radixlm.server.protocol import ScoreRequest
from radixlm.server.state import server_state, tenant_salt
from radixlm.server.streams import collect, race_disconnect

router = APIRouter(tags=["scoring"], responses=ERROR_RESPONSES)


@router.post("/v1/score")
async def score(body: ScoreRequest, request: Request) -> Any:
    """``{"scores": [[p per label] per item], "usage": ...}``; a label id outside the
    vocabulary is a 400 whose body has SGLang's fields (``type`` ``BadRequestError``,
    ``message``) beside OpenAI's ``error``."""
    check_fields(request, body)
    state = server_state(request)
    try:
        lora = state.check_model(body.model)
        obj = ScoreInput(body.query, body.items, body.label_token_ids, body.apply_softmax,
                         body.item_first, tenant_salt(request, body.cache_salt), lora)  # fmt: skip
        reqs = obj.generate_input(state.runtime.backend.info["vocab_size"]).split()
        results = await race_disconnect(request, collect(state.runtime, reqs))
    except ValueError as e:
        message, param, code = fmt.openai_message(str(e))
        sglang = {"object": "error", "message": message, "type": "BadRequestError",
                  "param": param, "code": 400}  # fmt: skip
        return JSONResponse({**error_body(400, message, param, code), **sglang}, 400)
    prompt_tokens = sum(r["meta_info"]["prompt_tokens"] for r in results)
    return {
        "object": "scoring",
        "scores": obj.scores(results),
        "model": lora or state.served_model_name,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0,
                  "total_tokens": prompt_tokens},
    }
