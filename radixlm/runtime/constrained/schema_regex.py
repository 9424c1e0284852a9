"""JSON schema -> regex through outlines-core, patched where outlines-core falls short.

outlines-core ignores numeric bounds and emits format regexes that can break the JSON string
around them (a quoted e-mail local part, a stray backslash in ``time``, unescaped quotes in
``uri``) or name impossible dates. Such sub-schemas are swapped for a unique string ``const``
before conversion, and its literal in the resulting regex is then replaced by our own regex.
Keywords outlines-core would silently ignore raise ValueError instead.
"""

from __future__ import annotations

import json
from typing import Any

from outlines_core.json_schema import build_regex_from_schema

from radixlm.runtime.constrained.number_regex import (
    FRACTION,
    MAX_DIGITS,
    MAX_MAGNITUDE,
    int_at_or_above,
    int_at_or_below,
    integer_range_regex,
    number_range_regex,
)

_DATE = (
    r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_TIME = (
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?"
_FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "email": (
        rf"[a-zA-Z0-9_%+-]{{1,20}}(?:\.[a-zA-Z0-9_%+-]{{1,20}}){{0,3}}"
        rf"@(?:{_LABEL}\.){{1,3}}[a-z]{{2,6}}"
    ),
    "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    "uri": rf"https?://(?:{_LABEL}\.){{1,3}}[a-z]{{2,6}}(?:/[a-zA-Z0-9._~%-]{{1,20}}){{0,5}}/?",
}
_UNSUPPORTED = (
    "uniqueItems",
    "multipleOf",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties")


def json_schema_regex(schema: str, whitespace_pattern: str) -> str:
    """The regex outlines-core builds for ``schema`` (JSON text), with the patches above."""
    try:
        obj = json.loads(schema)
    except json.JSONDecodeError as e:
        raise ValueError(f"json_schema is not valid JSON: {e}") from e
    if not isinstance(obj, dict):
        raise ValueError("json_schema must be a JSON object")  # noqa: TRY004 - user input
    patches: dict[str, str] = {}
    rewritten = _rewrite(obj, patches)
    try:
        regex = build_regex_from_schema(json.dumps(rewritten), whitespace_pattern)
    except ValueError as e:
        raise ValueError(f"unsupported json_schema: {e}") from e
    for placeholder, patch in patches.items():
        regex = regex.replace(json.dumps(placeholder), f"({patch})")
    return bound_numbers(regex)


# NOTE: outlines-core's number pieces have no length limit, and a small model can loop in a
# number until max_tokens; a double holds 17 significant digits, more is noise.
_UNBOUNDED_NUMBER_PARTS = {
    "(0|[1-9][0-9]*)": f"(0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})",
    r"(\.[0-9]+)?": f"({FRACTION})?",
    r"([eE][+-][0-9]+)?": r"([eE][+-][0-9]{1,3})?",
}


def bound_numbers(regex: str) -> str:
    """The schema regex with integer digits, fraction digits and exponents bounded."""
    for unbounded, bounded in _UNBOUNDED_NUMBER_PARTS.items():
        regex = regex.replace(unbounded, bounded)
    return regex


def _rewrite(node: Any, patches: dict[str, str]) -> Any:
    if not isinstance(node, dict):
        return node
    _check_supported(node)
    patch = _patch_for(node)
    if patch is not None:
        placeholder = f"__radixlm_patch_{len(patches)}__"
        patches[placeholder] = patch
        return {"const": placeholder}
    out = dict(node)
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {k: _rewrite(v, patches) for k, v in node[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_rewrite(v, patches) for v in node[key]]
    for key in _SCHEMA_VALUES:
        if key in node:
            out[key] = _rewrite(node[key], patches)
    return out


def _check_supported(node: dict) -> None:
    for key in _UNSUPPORTED:
        if key in node and not (key == "uniqueItems" and node[key] is False):
            raise ValueError(
                f"json_schema keyword {key!r} is not supported by the outlines grammar backend"
            )
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        raise ValueError(
            "json_schema 'allOf' with more than one schema is not supported by the "
            "outlines grammar backend"
        )


def _patch_for(node: dict) -> str | None:
    kind = node.get("type")
    if kind in ("integer", "number") and any(k in node for k in _BOUNDS):
        return _number_patch(node, kind)
    if kind == "string" and node.get("format") in _FORMATS:
        return f'"{_FORMATS[node["format"]]}"'
    return None


def _number_patch(node: dict, kind: str) -> str:
    lo, lo_excl = _bound(node, "minimum", "exclusiveMinimum", max)
    hi, hi_excl = _bound(node, "maximum", "exclusiveMaximum", min)
    # NOTE: no bound is the widest (16 digits, see number_regex); a bound of 1e300 would allow
    # 300 digits and unroll into a huge regex
    lo = None if lo is not None and lo < -MAX_MAGNITUDE else lo
    hi = None if hi is not None and hi > MAX_MAGNITUDE else hi
    if kind == "number":
        return number_range_regex(lo, hi, lo_excl, hi_excl)
    int_lo = None if lo is None else int_at_or_above(lo, lo_excl)
    int_hi = None if hi is None else int_at_or_below(hi, hi_excl)
    return integer_range_regex(int_lo, int_hi)


def _bound(node: dict, inclusive: str, exclusive: str, tighter: Any) -> tuple[float | None, bool]:
    value = node.get(inclusive)
    excl = node.get(exclusive)
    if isinstance(excl, bool):
        return value, excl and value is not None
    if excl is None:
        return value, False
    if value is None or tighter(value, excl) == excl:
        return excl, True
    return value, False
