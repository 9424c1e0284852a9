"""The tools a request offers: validated once, then turned into a prompt and a grammar.

``check_tools`` takes OpenAI's ``tools`` list (dicts) and returns ``ToolSpec`` objects, raising a
ValueError that names the field for anything a client got wrong. ``calls_constraint`` builds the
regex that makes every call parse and its arguments match their schema.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any

from radixlm.runtime.constrained.schema_regex import json_schema_regex
from radixlm.runtime.constrained.specs import canonical_schema
from radixlm.runtime.constrained.text_regex import text_without
from radixlm.runtime.function_call.base import ToolParser

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_EMPTY_OBJECT = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call."""

    name: str
    description: str | None
    parameters: dict[str, Any]
    strict: bool = False

    def openai(self) -> dict[str, Any]:
        """The OpenAI tool dict, as chat templates expect it."""
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


def check_tools(tools: list[dict[str, Any]], whitespace: str = "") -> list[ToolSpec]:
    """Validated tools; every schema is compiled to a regex once to prove it can constrain."""
    specs, seen = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if tool.get("type") != "function":
            raise ValueError(f"{where}.type must be 'function', got {tool.get('type')!r}")
        fn = tool.get("function") or {}
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}"
            )
        if name in seen:
            raise ValueError(f"{where}.function.name {name!r} is defined twice")
        seen.add(name)
        params = fn.get("parameters") or _EMPTY_OBJECT
        try:
            arguments_regex(params, whitespace)
        except ValueError as e:
            raise ValueError(f"{where}.function.parameters: {e}") from None
        specs.append(ToolSpec(name, fn.get("description"), params, bool(fn.get("strict"))))
    return specs


def named_tool(tools: list[ToolSpec], name: str) -> ToolSpec:
    """The tool ``tool_choice`` names; ValueError if none has that name."""
    for tool in tools:
        if tool.name == name:
            return tool
    known = [t.name for t in tools]
    raise ValueError(f"tool_choice.function.name {name!r} is not one of the tools {known}")


def arguments_regex(parameters: dict[str, Any], whitespace: str) -> str:
    """The regex of a call's arguments object for a ``parameters`` schema."""
    if not isinstance(parameters, dict):
        raise ValueError("must be a JSON schema object")
    if parameters.get("type", "object") != "object":
        raise ValueError(f"must describe an object, got type {parameters.get('type')!r}")
    return _schema_regex(canonical_schema(parameters), whitespace)


@functools.lru_cache(maxsize=1024)
def _schema_regex(schema: str, whitespace: str) -> str:
    # NOTE: agents send the same tools with every request; each schema converts once
    return json_schema_regex(schema, whitespace)


def calls_constraint(
    parser: ToolParser, tools: list[ToolSpec], parallel: bool, free_text: bool, whitespace: str
) -> str | None:
    """The regex of an output of calls to ``tools`` in ``parser``'s format, or None when the
    format has no grammar. With ``free_text`` (``auto``), text without the format's opening tag
    may come first and the calls are optional."""
    ones = []
    for tool in tools:
        one = parser.call_regex(tool.name, arguments_regex(tool.parameters, whitespace))
        if one is None:
            return None
        ones.append(one)
    calls = parser.calls_regex("|".join(f"(?:{one})" for one in ones), parallel)
    if calls is None:
        return None
    if not free_text:
        return calls
    if parser.trigger is None:
        return None
    return f"{text_without(parser.trigger)}(?:{calls})?"


def builtin_tool_prompt(tools: list[ToolSpec]) -> str:
    """The system-prompt text offering ``tools`` to a model whose chat template has no tool
    support: each function's signature as JSON, and calls as JSON inside ``<tool_call>`` tags
    (the hermes format)."""
    lines = [
        "You may call one or more functions to assist with the user query.",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
        *(json.dumps(t.openai()["function"], ensure_ascii=False) for t in tools),
        "</tools>",
        "For each function call, return a JSON object with the function name and arguments "
        "within <tool_call></tool_call> XML tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call>",
    ]
    return "\n".join(lines)
