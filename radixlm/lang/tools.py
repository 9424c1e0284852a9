"""Tool calls from ``@function`` programs: ``gen(name, tools=[...], tool_choice=...)``.

A program offers tools in its own text (``tools_prompt(tools)`` in a system message gives the
built-in hermes prompt); the ``gen`` is then constrained like the server's ``tool_choice``:
``required`` or a tool's name -> only calls, each matching its schema; ``auto`` -> free text,
calls constrained when a tool is ``strict``. The calls are parsed back into
``s.get_meta_info(name)["tool_calls"]`` (``s.tool_calls(name)``): ``{"name", "arguments"}``
dicts with the arguments decoded. The grammar is a regex, so it works on every backend that
takes one (the in-process Engine, a radixlm server, an OpenAI-compatible radixlm server).
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.runtime.function_call import BUILTIN_TOOL_PARSER, get_tool_parser
from radixlm.runtime.function_call.toolset import (
    builtin_tool_prompt,
    calls_constraint,
    check_tools,
    named_tool,
)

_FORMAT = BUILTIN_TOOL_PARSER


def tools_prompt(tools: list[dict[str, Any]]) -> str:
    """The system-prompt text that offers ``tools`` (OpenAI tool dicts)."""
    return builtin_tool_prompt(check_tools(tools))


def tool_call_regex(
    tools: list[dict[str, Any]], tool_choice: str | dict | None, parallel: bool = False
) -> str | None:
    """The regex a ``gen`` with these tools is constrained by, or None (unconstrained)."""
    specs = check_tools(tools)
    parser = get_tool_parser(_FORMAT)
    choice = tool_choice or "auto"
    if isinstance(choice, dict):
        choice = (choice.get("function") or {}).get("name")
    if choice == "auto":
        if not any(t.strict for t in specs):
            return None
        return calls_constraint(parser, specs, parallel, True, "")
    if choice == "required":
        return calls_constraint(parser, specs, parallel, False, "")
    if not isinstance(choice, str):
        raise ValueError("tool_choice must be 'auto', 'required', a tool name or a named dict")
    return calls_constraint(parser, [named_tool(specs, choice)], parallel, False, "")


def read_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """The text outside the calls, and the calls with their arguments decoded."""
    parsed = get_tool_parser(_FORMAT).parse(text)
    calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in parsed.calls]
    return parsed.content, calls
