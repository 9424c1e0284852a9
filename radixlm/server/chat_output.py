"""The assistant's output read back into OpenAI's message shape: reasoning first, then tool
calls, whole (``message``) or streamed (``delta`` by ``delta``)."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from radixlm.runtime.function_call.base import CallDelta, StreamParser, ToolCall
from radixlm.runtime.function_call.hermes import HermesParser
from radixlm.server.chat_tools import ChatPlan


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def chat_message(plan: ChatPlan, text: str) -> tuple[dict[str, Any], bool]:
    """The ``message`` of a finished choice, and whether it holds tool calls."""
    reasoning, content = (None, text) if plan.reasoning is None else plan.reasoning.split(text)
    # NOTE: reasoning_content always present (null without reasoning), as SGLang answers
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": None}
    if reasoning is not None:
        message["reasoning_content"] = message["reasoning"] = reasoning
    if plan.parser is None:
        return message, False
    parsed = plan.parser.parse(content)
    if plan.calls_only:
        message["content"] = None
    if not parsed.calls:
        return message, False
    message["content"] = None if plan.calls_only else parsed.content or None
    message["tool_calls"] = [_whole_call(c) for c in parsed.calls]
    return message, True


def _whole_call(call: ToolCall) -> dict[str, Any]:
    fn = {"name": call.name, "arguments": call.arguments}
    return {"id": call_id(), "type": "function", "function": fn}


class ChoiceStream:
    """One streamed choice: feed the new text of each chunk, get the ``delta`` to send."""

    def __init__(self, plan: ChatPlan) -> None:
        self.reasoning = None if plan.reasoning is None else plan.reasoning.stream()
        self.calls: StreamParser | None = None if plan.parser is None else plan.parser.stream()
        self.calls_only = plan.calls_only
        self.has_calls = False
        # NOTE: when a grammar admits only hermes calls, every `<tool_call>\n{"name":"X"` opens a
        # call that will complete, so its name is sent first and the arguments when it closes
        hermes = isinstance(plan.parser, HermesParser)
        self._early = _EarlyNames() if plan.calls_only and hermes else None

    def feed(self, text: str) -> dict[str, Any]:
        reasoning, content = ("", text) if self.reasoning is None else self.reasoning.feed(text)
        return self._delta(reasoning, content, final=False)

    def finish(self) -> dict[str, Any]:
        reasoning, content = ("", "") if self.reasoning is None else self.reasoning.finish()
        return self._delta(reasoning, content, final=True)

    def _delta(self, reasoning: str, content: str, final: bool) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        if reasoning:
            delta["reasoning_content"] = delta["reasoning"] = reasoning
        if self.calls is None:
            if content:
                delta["content"] = content
            return delta
        parsed = self.calls.feed(content) if content else None
        pieces = [parsed] if parsed else []
        if final:
            pieces.append(self.calls.finish())
        text = "" if self.calls_only else "".join(p.content for p in pieces)
        calls = [c for p in pieces for c in p.calls]
        if self._early is not None:
            named = self._early.feed(content) + self._early.without_sent_names(calls)
            calls = sorted(named, key=lambda c: c.index)
        if text:
            delta["content"] = text
        if calls:
            self.has_calls = True
            delta["tool_calls"] = [_call_delta(c) for c in _merged(calls)]
        return delta


class _EarlyNames:
    """Names of hermes calls as soon as the grammar-constrained text has written them."""

    OPENING = re.compile(r'<tool_call>\n\{"name":"((?:[^"\\]|\\.)*)"')

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0

    def feed(self, text: str) -> list[CallDelta]:
        self.text += text
        out, end = [], 0
        for m in self.OPENING.finditer(self.text):
            out.append(CallDelta(self.sent, json.loads(f'"{m.group(1)}"')))
            self.sent, end = self.sent + 1, m.end()
        self.text = self.text[end:]  # NOTE: each opening is read once
        return out

    def without_sent_names(self, calls: list[CallDelta]) -> list[CallDelta]:
        return [CallDelta(c.index, None if c.index < self.sent else c.name, c.arguments)
                for c in calls]


def _merged(calls: list[CallDelta]) -> list[CallDelta]:
    """Consecutive pieces of the same call as one piece."""
    out: list[CallDelta] = []
    for c in calls:
        if out and out[-1].index == c.index:
            last = out[-1]
            out[-1] = CallDelta(c.index, last.name or c.name, last.arguments + c.arguments)
        else:
            out.append(c)
    return out


def _call_delta(d: CallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": d.index}
    if d.name is not None:
        out.update(id=call_id(), type="function", function={"name": d.name, "arguments": ""})
    if d.arguments:
        out.setdefault("function", {})["arguments"] = d.arguments
    return out
