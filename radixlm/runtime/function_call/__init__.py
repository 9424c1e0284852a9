"""Tool-call formats: split a model's output into text and function calls.

Formats register themselves by name (``--tool-call-parser``); ``detect_tool_parser`` picks one
from a chat template's text.
"""

from __future__ import annotations

from radixlm.runtime.function_call import hermes, llama3, mistral, pythonic  # noqa: F401
from radixlm.runtime.function_call.base import (
    TOOL_PARSERS,
    CallDelta,
    ParseResult,
    StreamDelta,
    StreamParser,
    ToolCall,
    ToolParser,
    compact_json,
    register_tool_parser,
)
from radixlm.runtime.function_call.scanning import merge_deltas

DEFAULT_TOOL_PARSER = "hermes"
BUILTIN_TOOL_PARSER = "builtin"  # NOTE: the format the built-in tool prompt asks for

# NOTE: checked in order; the first marker found in the template names its format.
_TEMPLATE_MARKERS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("[func_name1(", "pythonic"),
    ("<|python_tag|>", "llama3"),
)


def get_tool_parser(name: str) -> ToolParser:
    """A parser for the format registered as ``name``."""
    if name not in TOOL_PARSERS:
        known = ", ".join(sorted(TOOL_PARSERS))
        raise ValueError(f"unknown tool_call_parser {name!r}; known parsers: {known}")
    return TOOL_PARSERS[name]()


def detect_tool_parser(chat_template: str | None) -> str:
    """The format a chat template asks for; ``hermes`` (the server's own tool prompt) when the
    template shows none."""
    template = chat_template or ""
    for marker, name in _TEMPLATE_MARKERS:
        if marker in template:
            return name
    if '"parameters"' in template and "<|start_header_id|>" in template:
        return "llama3"
    return DEFAULT_TOOL_PARSER


__all__ = [
    "BUILTIN_TOOL_PARSER",
    "DEFAULT_TOOL_PARSER",
    "TOOL_PARSERS",
    "CallDelta",
    "ParseResult",
    "StreamDelta",
    "StreamParser",
    "ToolCall",
    "ToolParser",
    "compact_json",
    "detect_tool_parser",
    "get_tool_parser",
    "merge_deltas",
    "register_tool_parser",
]
