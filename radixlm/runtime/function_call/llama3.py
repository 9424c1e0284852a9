"""Llama 3.x JSON calls: ``{"name": "f", "parameters": {...}}`` as the whole output (the 3.1
template makes the model answer with bare JSON), or after ``<|python_tag|>``; several calls are
separated by ``;``."""

from __future__ import annotations

from radixlm.runtime.function_call.base import ToolCall, register_tool_parser
from radixlm.runtime.function_call.json_calls import call_from_text, json_call_regex
from radixlm.runtime.function_call.scanning import (
    NEED_MORE,
    Scan,
    ScanningToolParser,
    View,
    skip_space,
    text_until,
)

PYTHON_TAG = "<|python_tag|>"


@register_tool_parser("llama3")
class Llama3Parser(ScanningToolParser):
    """Calls open the output (bare JSON objects with "name" and "parameters") or follow
    ``<|python_tag|>`` anywhere. Bare JSON is held back until it is known to be a call or not."""

    # NOTE: bare JSON has no opening tag, so a grammar cannot tell text from a call.
    trigger = None

    def scan(self, view: View) -> Scan:
        buf = view.text
        if buf.startswith(PYTHON_TAG):
            found = _calls(view, len(PYTHON_TAG), tagged=True)
            return found or (PYTHON_TAG, len(PYTHON_TAG))
        if view.at_start:
            space = skip_space(buf, 0)
            if space:
                return buf[:space], space
            found = _calls(view, 0, tagged=False) if buf[0] == "{" else None
            if found:
                return found
        return text_until(view, PYTHON_TAG)

    def call_regex(self, name: str, arguments_regex: str) -> str:
        return json_call_regex(name, arguments_regex, "parameters")

    def calls_regex(self, one_call: str, parallel: bool) -> str:
        return f"(?:{one_call})(?:;(?:{one_call}))*" if parallel else one_call


def _calls(view: View, pos: int, tagged: bool) -> Scan | None:
    """Calls separated by ``;`` from ``pos`` on; None when there is none."""
    buf, calls, end = view.text, [], pos
    start = skip_space(buf, pos)
    while start < len(buf) and buf[start] == "{":
        close = view.bracket_end(start)
        call = None if close is None else call_from_text(buf[start:close], not tagged)
        if call is None:
            return NEED_MORE if close is None and not view.final else _found(calls, end)
        calls.append(call)
        end = close
        start = skip_space(buf, end)
        if start < len(buf) and buf[start] == ";":
            start = skip_space(buf, start + 1)
    if start == len(buf) and not view.final:
        return NEED_MORE
    return _found(calls, end)


def _found(calls: list[ToolCall], end: int) -> Scan | None:
    return (calls, end) if calls else None
