"""Calls written as JSON objects ``{"name": ..., "arguments": {...}}``: decoding and regexes."""

from __future__ import annotations

import json

from radixlm.runtime.constrained.specs import escape_literal
from radixlm.runtime.function_call.base import ToolCall, compact_json

ARGUMENT_KEYS = ("arguments", "parameters")


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def load_json(text: str) -> object:
    """Strict JSON decoding (no NaN / Infinity); raises ValueError."""
    return json.loads(text, parse_constant=_reject_constant)


def arguments_json(value: object) -> str | None:
    """A call's arguments as compact JSON text: an object, or a string holding one; missing or
    empty means ``{}``. None when they are not an object."""
    if value is None or value == "":
        return "{}"
    if isinstance(value, str):
        try:
            value = load_json(value)
        except ValueError:
            return None
    return compact_json(value) if isinstance(value, dict) else None


def call_from_object(value: object, require_arguments: bool = False) -> ToolCall | None:
    """The call a decoded JSON object describes, or None when it is not a well-formed call."""
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    key = next((key for key in ARGUMENT_KEYS if key in value), None)
    if key is None and require_arguments:
        return None
    arguments = arguments_json(value.get(key) if key else None)
    return None if arguments is None else ToolCall(name, arguments)


def call_from_text(text: str, require_arguments: bool = False) -> ToolCall | None:
    """The call a JSON object's text describes, or None when it is not a well-formed call."""
    try:
        value = load_json(text)
    except ValueError:
        return None
    return call_from_object(value, require_arguments)


def calls_from_text(text: str) -> list[ToolCall]:
    """The calls of a JSON array of call objects (or one object); empty when any is malformed."""
    try:
        value = load_json(text)
    except ValueError:
        return []
    items = value if isinstance(value, list) else [value]
    calls = [call_from_object(item) for item in items]
    return calls if calls and all(calls) else []


def json_call_regex(name: str, arguments_regex: str, key: str) -> str:
    """The regex of the compact object ``{"name":NAME,"KEY":ARGUMENTS}``."""
    head = escape_literal(f'{{"name":{compact_json(name)},"{key}":')
    return f"{head}(?:{arguments_regex})\\}}"
