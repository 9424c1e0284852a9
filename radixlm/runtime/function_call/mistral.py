"""Mistral calls: ``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]``, and the newer
``[TOOL_CALLS]f[ARGS]{...}`` (one tag per call)."""

from __future__ import annotations

import re

from radixlm.runtime.function_call.base import ToolCall, register_tool_parser
from radixlm.runtime.function_call.json_calls import (
    arguments_json,
    calls_from_text,
    json_call_regex,
    load_json,
)
from radixlm.runtime.function_call.scanning import (
    NEED_MORE,
    Scan,
    ScanningToolParser,
    View,
    skip_space,
    text_until,
)

TAG = "[TOOL_CALLS]"
ARGS_TAG = "[ARGS]"
_NAME = re.compile(r"[\w.-]+")


@register_tool_parser("mistral")
class MistralParser(ScanningToolParser):
    """Calls follow the ``[TOOL_CALLS]`` token, as a JSON array or as ``name[ARGS]{...}``."""

    trigger = TAG

    def scan(self, view: View) -> Scan:
        buf = view.text
        if not buf.startswith(TAG):
            return text_until(view, TAG)
        start = skip_space(buf, len(TAG))
        if start == len(buf):
            return (TAG, len(TAG)) if view.final else NEED_MORE
        if buf[start] in "[{":
            return _json_calls(view, start)
        return _named_call(view, start)

    def call_regex(self, name: str, arguments_regex: str) -> str:
        return json_call_regex(name, arguments_regex, "arguments")

    def calls_regex(self, one_call: str, parallel: bool) -> str:
        more = f"(?:,(?:{one_call}))*" if parallel else ""
        return f"\\[TOOL_CALLS\\]\\[(?:{one_call}){more}\\]"


def _json_calls(view: View, start: int) -> Scan:
    buf, end = view.text, view.bracket_end(start)
    if end is None:
        return (buf, len(buf)) if view.final else NEED_MORE
    calls = calls_from_text(buf[start:end])
    return (calls, end) if calls else (buf[:end], end)


def _named_call(view: View, start: int) -> Scan:
    """``name[ARGS]{...}`` after the tag; the tag alone is text when it is not that."""
    buf = view.text
    name = _NAME.match(buf, start)
    if name is None:
        return TAG, len(TAG)
    opening = name.end() + len(ARGS_TAG)
    if not ARGS_TAG.startswith(buf[name.end() : opening]):
        return TAG, len(TAG)
    if opening >= len(buf):
        return (TAG, len(TAG)) if view.final else NEED_MORE
    if buf[opening] != "{":
        return TAG, len(TAG)
    end = view.bracket_end(opening)
    if end is None:
        return (buf, len(buf)) if view.final else NEED_MORE
    arguments = _object_arguments(buf[opening:end])
    if arguments is None:
        return buf[:end], end
    return [ToolCall(name.group(), arguments)], end


def _object_arguments(text: str) -> str | None:
    try:
        return arguments_json(load_json(text))
    except ValueError:
        return None
