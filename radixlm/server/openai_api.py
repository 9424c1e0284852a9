"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions (and the chat
call that /v1/responses serves through)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request

from radixlm.runtime.io_struct import GenerateInput, SingleRequest
from radixlm.runtime.tokenizer_manager import THREAD_TOKENIZE_CHARS
from radixlm.server import openai_format as fmt
from radixlm.server.chat_output import ChoiceStream, chat_message
from radixlm.server.chat_prompt import check_text_only, template_text
from radixlm.server.chat_tools import ChatPlan, plan_chat
from radixlm.server.errors import ERROR_RESPONSES, STREAM_RESPONSE, APIError
from radixlm.server.lenient import check_fields
from radixlm.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from radixlm.server.state import ServerState, server_state, tenant_salt
from radixlm.server.streams import (
    DONE_FRAME,
    collect,
    generate_chunks,
    race_disconnect,
    sse,
    sse_response,
)

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES)


@dataclass
class Call:
    """One OpenAI call being served: its requests and how to label its responses."""

    state: ServerState
    body: SamplingFields
    reqs: list[SingleRequest]
    kind: str
    plan: ChatPlan
    lora: str | None = None  # the LoRA adapter the request's model names
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, obj: str, choices: list[dict]) -> dict[str, Any]:
        prefix = "chatcmpl" if self.kind == "chat" else "cmpl"
        return {
            "id": f"{prefix}-{self.id}",
            "object": obj,
            "created": self.created,
            "model": self.lora or self.state.served_model_name,
            "choices": choices,
        }

    def prompt_text(self, i: int) -> str:
        req = self.reqs[i]
        return req.text if req.text is not None else self.state.tokenizer.decode(req.input_ids)


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The model this server serves and its LoRA adapters (with the model as their parent)."""
    state = server_state(request)
    cards = [_model_card(state)] + [_lora_card(state, name) for name in state.loras]
    return {"object": "list", "data": cards}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    """The model ``model`` (404 unless it is the one served)."""
    state = server_state(request)
    lora = state.check_model(model, lookup=True)
    return _model_card(state) if lora is None else _lora_card(state, lora)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": state.started,
        "owned_by": "radixlm",
        "root": state.model_path,
        "max_model_len": state.context_len,
    }


def _lora_card(state: ServerState, name: str) -> dict[str, Any]:
    return {**_model_card(state), "id": name, "root": state.loras[name],
            "parent": state.served_model_name}  # fmt: skip


@router.post("/completions", responses=STREAM_RESPONSE)
async def completions(body: CompletionRequest, request: Request) -> Any:
    """Text completion for one prompt or a batch (strings or token ids)."""
    check_fields(request, body)
    try:
        call = _start(request, body, fmt.completion_input(body), "completion")
        if body.stream:
            return await sse_response(request, _completion_frames(call))
        results = await finished(request, call)
        choices = [_completion_choice(call, i, r) for i, r in enumerate(results)]
        return {**call.envelope("text_completion", choices), "usage": fmt.usage(results, body.n)}
    except ValueError as e:
        raise APIError(400, *fmt.openai_message(str(e))) from None


@router.post("/chat/completions", responses=STREAM_RESPONSE)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    """Chat completion through the model's chat template (or ``--chat-template``)."""
    check_fields(request, body)
    try:
        call = await chat_call(request, body)
        if body.stream:
            return await sse_response(request, _chat_frames(call))
        results = await finished(request, call)
        choices = [_chat_choice(call, i, r) for i, r in enumerate(results)]
        return {**call.envelope("chat.completion", choices), "usage": fmt.usage(results, body.n)}
    except ValueError as e:
        raise APIError(400, *fmt.openai_message(str(e))) from None


async def chat_call(request: Request, body: ChatCompletionRequest) -> Call:
    """The requests of a chat completion: tools and reasoning planned, messages rendered
    through the chat template and tokenised (ValueError for bad input)."""
    state = server_state(request)
    if state.tokenizer is None:
        raise ValueError(
            "messages are unavailable: the server runs with --skip-tokenizer-init (no "
            "tokenizer for the chat template); send token ids to /v1/completions"
        )
    check_text_only(body.messages)
    template = template_text(state.tokenizer, state.chat_template)
    args = state.args
    plan = plan_chat(
        body, template, args.tool_call_parser, args.reasoning_parser,
        args.constrained_json_whitespace_pattern,
    )
    obj = await _off_loop_if_long(
        body, fmt.chat_input, body, state.tokenizer, state.chat_template, plan,
        args.constrained_json_whitespace_pattern,
    )
    return _start(request, body, obj, "chat", plan)


async def _off_loop_if_long(body: ChatCompletionRequest, fn, *args):
    """``fn(*args)``, on a worker thread when the conversation is long enough that rendering
    and tokenising it would stall other clients."""
    size = sum(len(m.text()) for m in body.messages)
    if size < THREAD_TOKENIZE_CHARS:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


def _start(
    request: Request,
    body: SamplingFields,
    obj: GenerateInput,
    kind: str,
    plan: ChatPlan | None = None,
) -> Call:
    state = server_state(request)
    lora = state.check_model(body.model)
    if state.tokenizer is None:
        # NOTE: completions answer in text, which needs a tokenizer; /generate returns the ids.
        raise ValueError(
            "prompt is unavailable on /v1/completions: the server runs with "
            "--skip-tokenizer-init; POST input_ids to /generate, which returns output_ids"
        )
    obj.cache_salt = tenant_salt(request, obj.cache_salt)
    reqs = obj.split()
    for req in reqs:
        req.lora_name = lora
    return Call(state, body, reqs, kind, plan or ChatPlan(), lora)


async def finished(request: Request, call: Call) -> list[dict]:
    return await race_disconnect(request, collect(call.state.runtime, call.reqs))


def _completion_choice(call: Call, i: int, result: dict) -> dict[str, Any]:
    body: CompletionRequest = call.body  # type: ignore[assignment]
    meta = result["meta_info"]
    prefix = call.prompt_text(i) if body.echo else ""
    logprobs = None
    if body.logprobs is not None:
        logprobs = fmt.completion_logprobs(meta, 0, 0, body.echo)
    return {
        "index": i,
        "text": prefix + result["text"],
        "logprobs": logprobs,
        "finish_reason": fmt.finish_reason(meta),
        "matched_stop": fmt.matched_stop(meta),
    }


def _chat_choice(call: Call, i: int, result: dict) -> dict[str, Any]:
    meta = result["meta_info"]
    body: ChatCompletionRequest = call.body  # type: ignore[assignment]
    message, has_calls = chat_message(call.plan, result["text"])
    return {
        "index": i,
        "message": message,
        "logprobs": fmt.chat_logprobs(meta, 0) if body.logprobs else None,
        "finish_reason": _chat_finish(meta, has_calls),
        "matched_stop": fmt.matched_stop(meta),
    }


def _chat_finish(meta: dict[str, Any], has_calls: bool) -> str | None:
    reason = fmt.finish_reason(meta)
    return "tool_calls" if reason == "stop" and has_calls else reason


# -- streaming ------------------------------------------------------------------------------------


class _Progress:
    """What has been sent so far of each choice of a stream."""

    def __init__(self, k: int) -> None:
        self.text = [0] * k
        self.logprobs = [0] * k
        self.started = [False] * k
        self.final: list[dict | None] = [None] * k
        self.latest: list[dict | None] = [None] * k  # each choice's last chunk

    def advance(self, i: int, chunk: dict) -> tuple[str, int, bool]:
        """(new text, index of the first new logprob entry, whether this is the first chunk)."""
        meta = chunk["meta_info"]
        text = chunk["text"][self.text[i] :]
        lp_start, first = self.logprobs[i], not self.started[i]
        self.text[i] = len(chunk["text"])
        self.logprobs[i] = len(meta.get("output_token_logprobs", []))
        self.started[i] = True
        self.latest[i] = chunk
        if meta.get("finish_reason"):
            self.final[i] = chunk
        return text, lp_start, first

    def idle(self, i: int, text: str, lp_start: int, meta: dict) -> bool:
        """Nothing to send: no text, no logprobs and not finished."""
        return not text and self.logprobs[i] == lp_start and not meta.get("finish_reason")


async def _completion_frames(call: Call) -> AsyncIterator[str]:
    body: CompletionRequest = call.body  # type: ignore[assignment]
    progress = _Progress(len(call.reqs))
    async for i, chunk in generate_chunks(call.state.runtime, call.reqs):
        offset = progress.text[i]
        text, lp_start, first = progress.advance(i, chunk)
        meta = chunk["meta_info"]
        echo = body.echo and first
        if progress.idle(i, text, lp_start, meta) and not echo:
            continue
        if echo:
            text = call.prompt_text(i) + text
        logprobs = None
        if body.logprobs is not None:
            logprobs = fmt.completion_logprobs(meta, lp_start, offset, echo)
        choice = {"index": i, "text": text, "logprobs": logprobs}
        choice["finish_reason"] = fmt.finish_reason(meta)
        if choice["finish_reason"] is not None:
            choice["matched_stop"] = fmt.matched_stop(meta)
        yield sse(_chunk(call, "text_completion", choice, progress))
    async for frame in _stream_end(call, progress, "text_completion"):
        yield frame


async def _chat_frames(call: Call) -> AsyncIterator[str]:
    body: ChatCompletionRequest = call.body  # type: ignore[assignment]
    progress = _Progress(len(call.reqs))
    streams = [ChoiceStream(call.plan) for _ in call.reqs]
    obj = "chat.completion.chunk"
    async for i, chunk in generate_chunks(call.state.runtime, call.reqs):
        text, lp_start, first = progress.advance(i, chunk)
        meta = chunk["meta_info"]
        if first:
            delta = {"role": "assistant", "content": "", "reasoning_content": None}
            role = {"index": i, "delta": delta, "logprobs": None}
            yield sse(_chunk(call, obj, {**role, "finish_reason": None}, progress, opening=i))
        if progress.idle(i, text, lp_start, meta):
            continue
        delta = streams[i].feed(text)
        finish = fmt.finish_reason(meta)
        if finish is not None:
            delta = joined(delta, streams[i].finish())
            finish = _chat_finish(meta, streams[i].has_calls)
        logprobs = fmt.chat_logprobs(meta, lp_start) if body.logprobs else None
        if not delta and finish is None and not (logprobs and logprobs["content"]):
            continue
        delta.setdefault("reasoning_content", None)  # NOTE: SGLang's deltas always carry it
        choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if finish is not None:
            choice["matched_stop"] = fmt.matched_stop(meta)
        yield sse(_chunk(call, obj, choice, progress))
    async for frame in _stream_end(call, progress, obj):
        yield frame


def joined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two deltas of one choice as one (text fields concatenated, call lists appended)."""
    out = dict(a)
    for key, value in b.items():
        out[key] = out[key] + value if key in out else value
    return out


def _chunk(
    call: Call, obj: str, choice: dict[str, Any], progress: _Progress, opening: int | None = None
) -> dict[str, Any]:
    """One stream chunk; ``opening``: the choice whose role chunk this is (its tokens are not
    sent yet, so its usage counts none of them)."""
    out = call.envelope(obj, [choice])
    if call.body.continuous_usage:  # NOTE: counts so far, over the choices heard from
        n = call.body.n
        prompts = [progress.latest[i] for i in range(0, len(progress.latest), n)]
        prompt = sum(c["meta_info"]["prompt_tokens"] for c in prompts if c is not None)
        done = sum(c["meta_info"]["completion_tokens"] for i, c in enumerate(progress.latest)
                   if c is not None and i != opening)  # fmt: skip
        out["usage"] = {
            "prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done
        }
    elif call.body.include_usage:
        out["usage"] = None
    return out


async def _stream_end(call: Call, progress: _Progress, obj: str) -> AsyncIterator[str]:
    if call.body.include_usage and all(progress.final):
        results = [r for r in progress.final if r is not None]
        yield sse({**call.envelope(obj, []), "usage": fmt.usage(results, call.body.n)})
    yield DONE_FRAME
