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
# NOTE: type names that tool schemas written from code or databases use, as SGLang maps them
_TYPE_ALIASES = {
    **dict.fromkeys(("str", "text", "varchar", "char", "uuid", "date", "datetime", "time",
                     "timestamp", "bytes"), "string"),
    **dict.fromkeys(("int", "long", "short", "bigint", "smallint", "tinyint", "uint"), "integer"),
    **dict.fromkeys(("float", "double", "decimal", "real", "numeric", "num"), "number"),
    "bool": "boolean", "list": "array", "tuple": "array", "set": "array", "dict": "object",
    "map": "object",
}  # fmt: skip
_SIZED_TYPE = re.compile(r"(u?int|float)\d+|(varchar|char|decimal|numeric)\(.*\)")
_DATA_KEYS = frozenset(("enum", "const", "default", "examples", "description", "title"))
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


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
        params = standard_types(fn.get("parameters") or _EMPTY_OBJECT)
        try:
            arguments_regex(params, whitespace)
        except ValueError as e:
            raise ValueError(f"{where}.function.parameters: {e}") from None
        specs.append(ToolSpec(name, fn.get("description"), params, bool(fn.get("strict"))))
    return specs


def standard_types(schema: Any) -> Any:
    """``schema`` with common non-JSON-Schema type names (``int``, ``str``, ``float64``,
    ``varchar(255)``, ...) replaced by JSON Schema's, in a copy; the model's prompt and the
    grammar both see the standard names. Unknown names are kept (the grammar refuses them)."""
    if isinstance(schema, list):
        return [standard_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):  # NOTE: names -> schemas
            out[key] = {name: standard_types(s) for name, s in value.items()}
        else:
            out[key] = value if key in _DATA_KEYS else standard_types(value)
    kind = schema.get("type")
    if isinstance(kind, str):
        out["type"] = _standard_type(kind)
    elif isinstance(kind, list):
        out["type"] = list(dict.fromkeys(_standard_type(k) if isinstance(k, str) else k
                                         for k in kind))  # fmt: skip
    return out


def _standard_type(name: str) -> str:
    low = name.strip().lower()
    if low in _TYPE_ALIASES:
        return _TYPE_ALIASES[low]
    sized = _SIZED_TYPE.fullmatch(low)
    if sized:
        base = sized.group(1) or sized.group(2)
        return {"uint": "integer", "int": "integer", "float": "number", "decimal": "number",
                "numeric": "number"}.get(base, "string")  # fmt: skip
    return name


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
