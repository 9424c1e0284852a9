"""The tokenizer routes, in SGLang's and vLLM's shapes: ``POST /tokenize``, ``POST /detokenize``
and ``GET /tokenizer_info`` (what lm-evaluation-harness's ``remote`` tokenizer reads)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from radixlm.runtime.tokenizer_manager import check_text
from radixlm.server.chat_prompt import check_text_only, render_chat, template_text
from radixlm.server.errors import ERROR_RESPONSES, APIError
from radixlm.server.protocol import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from radixlm.server.state import ServerState, server_state

router = APIRouter(tags=["tokenizer"], responses=ERROR_RESPONSES)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    """Token ids of ``text``/``prompt``, or of chat ``messages`` rendered by the chat template."""
    state = server_state(request)
    state.check_model(body.model)
    tokenizer = _tokenizer(state)
    given = [k for k in ("text", "prompt", "messages") if getattr(body, k) is not None]
    if len(given) != 1:
        raise APIError(400, f"send exactly one of text, prompt or messages; got {given or 'none'}",
                       param="prompt")  # fmt: skip
    if body.messages is not None:
        text = _render(state, body)
        special = bool(body.add_special_tokens)  # NOTE: the template writes them (vLLM's default)
    else:
        text = body.text if body.text is not None else body.prompt
        check_text(given[0], text)
        special = body.add_special_tokens is not False
    tokens = tokenizer.encode(text, add_special_tokens=special)
    out: dict[str, Any] = {"tokens": tokens, "count": len(tokens)}
    out["max_model_len"] = state.context_len
    if body.return_token_strs:
        out["token_strs"] = tokenizer.convert_ids_to_tokens(tokens)
    return out


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    """The text of ``tokens``, as ``text`` (SGLang's name) and ``prompt`` (vLLM's)."""
    state = server_state(request)
    state.check_model(body.model)
    vocab = state.runtime.backend.info["vocab_size"]
    if any(t < 0 or t >= vocab for t in body.tokens):
        raise APIError(400, f"tokens must be token ids in [0, {vocab})", param="tokens")
    text = _tokenizer(state).decode(body.tokens, skip_special_tokens=body.skip_special_tokens)
    return {"text": text, "prompt": text}


@router.get("/tokenizer_info")
async def tokenizer_info(request: Request) -> dict[str, Any]:
    """The tokenizer's class, special tokens and chat template (vLLM's route)."""
    state = server_state(request)
    tokenizer = _tokenizer(state)
    special = {
        f"{name}_token": getattr(tokenizer, f"{name}_token", None)
        for name in ("bos", "eos", "pad", "unk")
    }
    return {
        "tokenizer_class": type(tokenizer).__name__,
        **special,
        "eos_token_ids": state.runtime.backend.info.get("eos_token_ids"),
        "add_bos_token": getattr(tokenizer, "add_bos_token", None),
        "chat_template": template_text(tokenizer, state.chat_template),
        "model_max_length": state.context_len,
        "vocab_size": state.runtime.backend.info["vocab_size"],
    }


def _render(state: ServerState, body: TokenizeRequest) -> str:
    chat = ChatCompletionRequest(
        messages=body.messages, add_generation_prompt=body.add_generation_prompt,
        continue_final_message=body.continue_final_message,
        chat_template_kwargs=body.chat_template_kwargs,
    )  # fmt: skip
    try:
        check_text_only(chat.messages)
        return render_chat(state.tokenizer, chat, state.chat_template)
    except ValueError as e:
        raise APIError(400, str(e), param="messages") from None


def _tokenizer(state: ServerState):
    if state.tokenizer is None:
        raise APIError(400, "the server runs with --skip-tokenizer-init and has no tokenizer")
    return state.tokenizer
