"""OpenAI's Responses API over the chat path: a request becomes a ``ChatCompletionRequest``;
the chat stream's deltas become output items (reasoning, message, function calls) and the
Responses stream events that build them."""

from __future__ import annotations

import uuid
from typing import Any

from radixlm.server.protocol import ChatCompletionRequest, ResponsesRequest, SamplingFields

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
STATELESS = (
    "this server does not store responses: send the whole conversation in input"
)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


# -- request ------------------------------------------------------------------------------------


def chat_request(body: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that ``body`` asks for; ValueError naming the field it cannot serve."""
    _check_stateless(body)
    if body.n != 1:
        raise ValueError("n must be 1 on /v1/responses (a response has one output)")
    if body.stream_options is not None:
        raise ValueError("stream_options is not supported on /v1/responses (usage always comes "
                         "with response.completed)")  # fmt: skip
    logprobs = "message.output_text.logprobs" in (body.include or []) or bool(body.top_logprobs)
    sampling = body.model_dump(include=set(SamplingFields.model_fields), exclude_none=True)
    sampling.pop("stream_options", None)
    chat: dict[str, Any] = {
        **sampling,
        "messages": _messages(body),
        "max_tokens": body.max_output_tokens,
        "logprobs": logprobs,
        "top_logprobs": body.top_logprobs if logprobs else None,
        "parallel_tool_calls": body.parallel_tool_calls,
        "chat_template_kwargs": body.chat_template_kwargs,
        "separate_reasoning": body.separate_reasoning,
    }
    if body.tools:
        chat["tools"] = [_tool(i, t) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        chat["tool_choice"] = _tool_choice(body.tool_choice)
    fmt = body.text.format if body.text else None
    if fmt is not None and fmt.type != "text":
        schema = {"name": fmt.name, "schema": fmt.schema_ or {}, "strict": fmt.strict}
        chat["response_format"] = {"type": fmt.type}
        if fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise ValueError("text.format.schema is required when text.format.type is "
                                 "json_schema")  # fmt: skip
            chat["response_format"]["json_schema"] = schema
    return ChatCompletionRequest.model_validate(chat)


def _check_stateless(body: ResponsesRequest) -> None:
    if body.previous_response_id is not None:
        raise ValueError(f"previous_response_id is not supported: {STATELESS}")
    if body.conversation is not None:
        raise ValueError(f"conversation is not supported: {STATELESS}")
    if body.prompt is not None:
        raise ValueError("prompt (a stored prompt template) is not supported: send instructions "
                         "and input")  # fmt: skip
    if body.background:
        raise ValueError("background is not supported: use stream for long responses")
    if body.truncation == "auto":
        raise ValueError("truncation 'auto' is not supported: the server does not drop input "
                         "items; an input over the context length is a 400")  # fmt: skip


def _messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as chat messages. Consecutive function calls join the
    assistant message before them; a reasoning item goes with the assistant turn after it."""
    out: list[dict[str, Any]] = []
    if body.instructions:
        out.append({"role": "system", "content": body.instructions})
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    if not items:
        raise ValueError("input must not be empty")
    reasoning: str | None = None
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
            msg: dict[str, Any] = {"role": role, "content": _text(item.get("content"), where)}
            if role == "assistant" and reasoning is not None:
                msg["reasoning_content"], reasoning = reasoning, None
            out.append(msg)
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function", "function": {
                "name": _field(item, "name", where), "arguments": _field(item, "arguments", where),
            }}  # fmt: skip
            last = out[-1] if out else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": None}
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
                out.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                        "content": content})  # fmt: skip
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        elif kind == "item_reference":
            raise ValueError(f"{where}: item_reference is not supported: {STATELESS}")
        else:
            raise ValueError(f"{where}.type must be message, function_call, function_call_output "
                             f"or reasoning, got {kind!r}")  # fmt: skip
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS:
            what = "is not supported by this text-only model" if kind else "must be an object"
            raise ValueError(f"{where}.content[{j}] ({kind or type(part).__name__}) {what}")
        value = part.get(TEXT_PARTS[kind])
        if not isinstance(value, str):
            raise ValueError(f"{where}.content[{j}].{TEXT_PARTS[kind]} must be a string")
        texts.append(value)
    return "".join(texts)


def _field(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string")
    return value


def _tool(i: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses function tool (flat) as a chat tool (nested under ``function``)."""
    if tool.get("type") != "function":
        raise ValueError(f"tools[{i}].type must be function (the only tool this server runs), "
                         f"got {tool.get('type')!r}")  # fmt: skip
    fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    extra = set(tool) - {"type", *fn}
    if extra:
        raise ValueError(f"tools[{i}]: unknown fields {sorted(extra)}")
    return {"type": "function", "function": fn}


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ValueError("tool_choice must be none, auto, required or {\"type\": \"function\", "
                         "\"name\": ...}")  # fmt: skip
    return {"type": "function", "function": {"name": choice["name"]}}


# -- response -----------------------------------------------------------------------------------


class OutputItems:
    """The output items of one response, built from the chat stream's deltas. Each call
    returns the stream events (without ``sequence_number``) for what changed."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item taking text or arguments
        self.calls: dict[int, dict[str, Any]] = {}  # the chat delta's call index -> item

    def feed(self, delta: dict[str, Any], logprobs: list[dict] | None = None) -> list[dict]:
        events: list[dict] = []
        if delta.get("reasoning_content"):
            events += self._text("reasoning", delta["reasoning_content"], None)
        if delta.get("content"):
            events += self._text("message", delta["content"], logprobs)
        for call in delta.get("tool_calls", []):
            events += self._call(call)
        return events

    def finish(self, complete: bool) -> list[dict]:
        """Close the open item (``complete`` False: the output was cut at its token limit)."""
        return self._close("completed" if complete else "incomplete")

    def _text(self, kind: str, text: str, logprobs: list[dict] | None) -> list[dict]:
        events = []
        if self.open is None or self.open["type"] != kind:
            events += self._close("completed")
            events += self._add(_empty(kind))
        item, index = self.open, len(self.items) - 1
        part = item["content"][0]
        part["text"] += text
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            return [*events, {"type": "response.reasoning_text.delta", **where, "delta": text}]
        part["logprobs"] += logprobs or []
        event = {"type": "response.output_text.delta", **where, "delta": text,
                 "logprobs": logprobs or []}  # fmt: skip
        return [*events, event]

    def _call(self, delta: dict[str, Any]) -> list[dict]:
        events = []
        fn = delta.get("function", {})
        if "name" in fn or delta["index"] not in self.calls:  # NOTE: a call's first delta
            events += self._close("completed")
            item = {"type": "function_call", "id": new_id("fc"),
                    "call_id": delta.get("id") or new_id("call"), "name": fn.get("name", ""),
                    "arguments": "", "status": "in_progress"}  # fmt: skip
            self.calls[delta["index"]] = item
            events += self._add(item)
        args = fn.get("arguments")
        if args:
            item = self.calls[delta["index"]]
            item["arguments"] += args
            events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                           "output_index": self.items.index(item), "delta": args})  # fmt: skip
        return events

    def _add(self, item: dict[str, Any]) -> list[dict]:
        self.items.append(item)
        self.open = item
        index = len(self.items) - 1
        events = [{"type": "response.output_item.added", "output_index": index,
                   "item": _copy(item)}]  # fmt: skip
        if item["type"] == "message":
            events.append({"type": "response.content_part.added", "item_id": item["id"],
                           "output_index": index, "content_index": 0,
                           "part": dict(item["content"][0])})  # fmt: skip
        return events

    def _close(self, status: str) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        item["status"] = status
        index = self.items.index(item)
        where = {"item_id": item["id"], "output_index": index}
        events: list[dict] = []
        if item["type"] == "message":
            part = item["content"][0]
            events.append({"type": "response.output_text.done", **where, "content_index": 0,
                           "text": part["text"], "logprobs": part["logprobs"]})  # fmt: skip
            events.append({"type": "response.content_part.done", **where, "content_index": 0,
                           "part": dict(part)})  # fmt: skip
        elif item["type"] == "reasoning":
            events.append({"type": "response.reasoning_text.done", **where, "content_index": 0,
                           "text": item["content"][0]["text"]})  # fmt: skip
        else:
            events.append({"type": "response.function_call_arguments.done", **where,
                           "name": item["name"], "arguments": item["arguments"]})  # fmt: skip
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": _copy(item)})  # fmt: skip
        return events


def _empty(kind: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning", "id": new_id("rs"), "summary": [], "status": "in_progress",
                "content": [{"type": "reasoning_text", "text": ""}]}  # fmt: skip
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    return {"type": "message", "id": new_id("msg"), "role": "assistant",
            "status": "in_progress", "content": [part]}  # fmt: skip


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot of ``item`` (later deltas must not change an event already built)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [{**p, "logprobs": list(p.get("logprobs", []))} if "logprobs" in p
                          else dict(p) for p in out["content"]]  # fmt: skip
    return out


def response_object(
    body: ResponsesRequest,
    rid: str,
    created: int,
    model: str,
    items: list[dict[str, Any]],
    status: str,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ``response`` object, as OpenAI returns it (``store`` false: nothing is kept)."""
    fmt = body.text.format if body.text and body.text.format else None
    text_format = fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": items,
        "parallel_tool_calls": body.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": body.reasoning or {"effort": None, "summary": None},
        "store": False,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "text": {"format": text_format},
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": body.user,
        "metadata": body.metadata or {},
    }


def usage(meta: dict[str, Any], reasoning_tokens: int) -> dict[str, Any]:
    prompt, output = meta["prompt_tokens"], meta["completion_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": min(meta.get("cached_tokens", 0), prompt)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, output)},
        "total_tokens": prompt + output,
        "prompt_tokens": prompt,  # NOTE: the chat names too, as SGLang's Responses usage has
        "completion_tokens": output,
    }
