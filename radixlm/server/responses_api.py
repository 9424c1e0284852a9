"""``POST /v1/responses``: OpenAI's Responses API, stateless, served by the chat path (same
template, tools, grammars, reasoning parser and cache). Streams send the Responses events."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request

from radixlm.server import openai_format as fmt
from radixlm.server import responses_format as rf
from radixlm.server.chat_output import ChoiceStream
from radixlm.server.errors import ERROR_RESPONSES, STREAM_RESPONSE, APIError, error_body
from radixlm.server.lenient import check_fields
from radixlm.server.openai_api import Call, chat_call, finished, joined
from radixlm.server.protocol import ResponsesRequest
from radixlm.server.streams import generate_chunks, sse_response

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES)


@router.post("/responses", responses=STREAM_RESPONSE)
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    """A model response to ``input`` (text or items), with function tools and ``text.format``;
    ``previous_response_id`` and other stored state are a 400 (nothing is stored)."""
    check_fields(request, body)
    try:
        reply = _Reply(body, await chat_call(request, rf.chat_request(body)))
        if body.stream:
            return await sse_response(request, _events(reply), on_error=reply.error_frames)
        result = (await finished(request, reply.call))[0]
        reply.take(result)
        return reply.response(result["meta_info"])
    except ValueError as e:
        raise APIError(400, *fmt.openai_message(str(e))) from None


class _Reply:
    """One response being built from its request's chunks."""

    def __init__(self, body: ResponsesRequest, call: Call) -> None:
        self.body, self.call = body, call
        self.id = rf.new_id("resp")
        self.created = int(time.time())
        self.items = rf.OutputItems()
        self.stream = ChoiceStream(call.plan)
        self.status = "in_progress"
        self.reasoning = ""
        self.text_sent = self.logprobs_sent = self.seq = 0

    def take(self, chunk: dict[str, Any]) -> list[dict]:
        """The events for what ``chunk`` (the output so far) adds."""
        meta = chunk["meta_info"]
        text, self.text_sent = chunk["text"][self.text_sent :], len(chunk["text"])
        start, self.logprobs_sent = self.logprobs_sent, len(meta.get("output_token_logprobs", []))
        delta = self.stream.feed(text)
        reason = fmt.finish_reason(meta)
        if reason is not None:
            delta = joined(delta, self.stream.finish())
        logprobs = fmt.chat_logprobs(meta, start)["content"] if self.call.body.logprobs else None
        self.reasoning += delta.get("reasoning_content", "")
        events = self.items.feed(delta, logprobs)
        if reason is not None:
            self.status = "incomplete" if reason == "length" else "completed"
            events += self.items.finish(self.status == "completed")
        return events

    def response(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        usage = None
        if meta is not None:
            tokenizer = self.call.state.tokenizer
            spent = len(tokenizer.encode(self.reasoning, add_special_tokens=False))
            usage = rf.usage(meta, spent if self.reasoning else 0)
        return rf.response_object(
            self.body, self.id, self.created, self.call.lora or self.call.state.served_model_name,
            self.items.items, self.status, usage,
        )

    def frame(self, event: dict[str, Any]) -> str:
        event["sequence_number"] = self.seq
        self.seq += 1
        return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def error_frames(self, err: APIError) -> list[str]:
        """An ``error`` event; its ``error`` object makes OpenAI's clients raise."""
        body = error_body(err.status, err.message, err.param, err.code)
        fields = {k: body["error"][k] for k in ("code", "message", "param")}
        return [self.frame({"type": "error", **fields, **body})]


async def _events(reply: _Reply) -> AsyncIterator[str]:
    chunks = generate_chunks(reply.call.state.runtime, reply.call.reqs)
    try:
        # NOTE: the first chunk comes before response.created, so bad input is still a 400
        _, chunk = await anext(chunks)
        started = reply.response()
        yield reply.frame({"type": "response.created", "response": started}) + reply.frame(
            {"type": "response.in_progress", "response": started}
        )
        while True:
            for event in reply.take(chunk):
                yield reply.frame(event)
            if reply.status != "in_progress":
                break
            _, chunk = await anext(chunks)
        final = reply.response(chunk["meta_info"])
        yield reply.frame({"type": f"response.{reply.status}", "response": final})
    finally:
        await chunks.aclose()
