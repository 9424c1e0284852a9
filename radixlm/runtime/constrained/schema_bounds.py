"""Digit bounds for JSON numbers, written into a schema, for backends that compile schemas
themselves (llguidance).

llguidance's number lexeme is ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?``, with no
length limit, and a small model can loop in a number until ``max_tokens``. A double holds 17
significant digits; more is noise. So every place a number may stand gets bounds that llguidance
turns into a finite regex: ``|n| < 10**16`` (client bounds are clamped to it), and for numbers
``multipleOf`` 1e-10: at most 10 fraction digits (llguidance refuses finer steps) and no
exponent. A ``multipleOf`` the client gave is kept. Places that admit any JSON value (``{}``,
``true``, a missing ``items``, a missing ``additionalProperties`` of an object without
``properties``) get a bounded any-value definition instead; an object with ``properties`` and no
``additionalProperties`` gets only those, as on the outlines backend. The outlines path bounds
its regex (``schema_regex.bound_numbers`` and ``number_regex``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

_LIMIT = 10**16 - 1
_FRACTION = 1e-10
_ANY = "radixlm_any_json"
_ANY_REF = {"$ref": f"#/$defs/{_ANY}"}
_ANNOTATIONS = {"title", "description", "default", "examples", "$comment", "deprecated"}
_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_VALUES = (
    "items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames",
    "unevaluatedProperties", "unevaluatedItems",
)
_LOW = ("minimum", "exclusiveMinimum")
_HIGH = ("maximum", "exclusiveMaximum")


def bound_schema_numbers(schema: str) -> str:
    """``schema`` (JSON text) with every number bounded as the module says."""
    try:
        root = json.loads(schema)
    except json.JSONDecodeError:
        return schema  # NOTE: the backend reports the syntax error in its own words
    if not isinstance(root, (dict, bool)):
        return schema
    bounded = _node(root)
    if not isinstance(bounded, dict):
        return schema
    defs = dict(bounded.get("$defs") or {})
    defs[_ANY] = _any_value()
    return json.dumps({**bounded, "$defs": defs})


def subschemas(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in ``node`` (itself first), following the keywords that hold
    schemas (so a property named ``not`` is a name, not a keyword)."""
    if not isinstance(node, dict):
        return
    yield node
    for key in _MAPS:
        if isinstance(node.get(key), dict):
            for child in node[key].values():
                yield from subschemas(child)
    for key in _LISTS:
        if isinstance(node.get(key), list):
            for child in node[key]:
                yield from subschemas(child)
    for key in _VALUES:
        yield from subschemas(node.get(key))


def _any_value() -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "null"},
            {"type": "boolean"},
            {"type": "string"},
            _bounded_number({"type": "number"}),
            {"type": "array", "items": _ANY_REF},
            {"type": "object", "additionalProperties": _ANY_REF},
        ]
    }


def _node(node: Any) -> Any:
    if node is True or (isinstance(node, dict) and set(node) <= _ANNOTATIONS):
        return _ANY_REF
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in _MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _node(v) for k, v in node[key].items()}
    for key in _LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_node(v) for v in node[key]]
    for key in _VALUES:
        if key in node:
            out[key] = _node(node[key])
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "object" in types and "additionalProperties" not in node:
        # NOTE: listed properties only, as outlines-core (and OpenAI's strict mode) does
        out["additionalProperties"] = False if "properties" in node else _ANY_REF
    if "array" in types and "items" not in node:
        out["items"] = _ANY_REF
    if "number" in types or "integer" in types:
        out = _bounded_number(out)
    return out


def _bounded_number(node: dict[str, Any]) -> dict[str, Any]:
    out = dict(node)
    for keys, sign in ((_LOW, -1), (_HIGH, 1)):
        given = [k for k in keys if isinstance(node.get(k), (int, float))]
        for k in given:  # NOTE: a bound of 1e300 would allow 300 digits
            out[k] = max(min(node[k], _LIMIT), -_LIMIT)
        if not given:
            out[keys[0]] = sign * _LIMIT
    types = node.get("type")
    if "number" in (types if isinstance(types, list) else [types]) and "multipleOf" not in node:
        out["multipleOf"] = _FRACTION
    return out
