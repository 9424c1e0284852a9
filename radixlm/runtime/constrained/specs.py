"""Constraint specs: which constraint a request asks for, normalised, plus checks on regexes."""

from __future__ import annotations

import json
import re
from typing import Any

try:
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

KINDS = ("regex", "json_schema", "choices", "ebnf")
_META = set("\\.^$|?*+()[]{}")


def _unsupported_ops() -> dict:
    look_around = "look-around assertions ((?=...), (?!...), (?<=...), (?<!...))"
    backrefs = "back-references (\\1, (?P=name), (?(1)...))"
    ops = {
        sre_parse.ASSERT: look_around,
        sre_parse.ASSERT_NOT: look_around,
        sre_parse.GROUPREF: backrefs,
        sre_parse.GROUPREF_EXISTS: backrefs,
        sre_parse.AT: "anchors and word boundaries other than a leading ^ and a trailing $",
    }
    for name, what in (
        ("ATOMIC_GROUP", "atomic groups (?>...)"),
        ("POSSESSIVE_REPEAT", "possessive quantifiers"),
    ):
        if hasattr(sre_parse, name):
            ops[getattr(sre_parse, name)] = what
    return ops


_UNSUPPORTED = _unsupported_ops()


def constraint_from_params(
    regex: str | None = None,
    json_schema: dict | str | None = None,
    choices: list[str] | str | None = None,
    ebnf: str | None = None,
) -> tuple[str, str] | None:
    """The request's constraint as ``(kind, spec)``, or None when it has none.

    ``json_schema`` may be a dict or a JSON string; it is normalised to compact JSON (property
    order kept, since it decides the order of generated keys). ``choices`` may be a list of
    strings or its JSON text; the spec is the compact JSON list. ``ebnf`` is a grammar in
    GBNF/EBNF (``root ::= ...``, as llama.cpp and xgrammar write it) or Lark syntax.
    """
    values = (regex, json_schema, choices, ebnf)
    given = [(k, v) for k, v in zip(KINDS, values) if v is not None]
    if len(given) > 1:
        names = ", ".join(k for k, _ in given)
        raise ValueError(f"only one of {', '.join(KINDS)} may be set; got {names}")
    if not given:
        return None
    kind, value = given[0]
    if kind == "json_schema":
        return kind, canonical_schema(value)
    if kind == "choices":
        return kind, json.dumps(parse_choices(value), separators=(",", ":"), ensure_ascii=False)
    if not isinstance(value, str):
        raise ValueError(f"{kind} must be a string, got {type(value).__name__}")  # noqa: TRY004
    if kind == "ebnf" and not value.strip():
        raise ValueError("ebnf must be a non-empty grammar")
    return kind, value


def canonical_schema(schema: dict | str) -> str:
    """Compact JSON text of a schema object; ValueError if it is not a JSON object."""
    obj = _load_json(schema, "json_schema") if isinstance(schema, str) else schema
    if not isinstance(obj, dict):
        kind = type(obj).__name__
        raise ValueError(f"json_schema must be a JSON object, got {kind}")  # noqa: TRY004
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def parse_choices(choices: list[str] | str) -> list[str]:
    """The list of choices from a list or its JSON text; ValueError unless non-empty strings."""
    items = _load_json(choices, "choices") if isinstance(choices, str) else choices
    if not isinstance(items, list) or not items:
        raise ValueError("choices must be a non-empty list of strings")
    if not all(isinstance(c, str) for c in items):
        raise ValueError("choices must be a non-empty list of strings")
    return list(items)


def choices_regex(choices: list[str]) -> str:
    """A regex matching exactly one of ``choices`` (each escaped literally)."""
    return "|".join(escape_literal(c) for c in choices)


def escape_literal(text: str) -> str:
    """Escape regex metacharacters; the result is valid in Python and Rust regex syntax."""
    return "".join("\\" + ch if ch in _META else ch for ch in text)


def check_regex(regex: str) -> str:
    """Reject features no backend supports; return the regex without a leading ^ / trailing $.

    Matching is always against the whole output, so those two anchors are redundant. A regex
    Python cannot parse (Rust-only syntax such as ``\\p{L}``) is passed on for the backend to judge.
    """
    stripped = _strip_outer_anchors(regex)
    try:
        parsed = sre_parse.parse(stripped)
    except re.error:
        return stripped
    for op in _walk_ops(parsed):
        if op in _UNSUPPORTED:
            raise ValueError(f"invalid regex {regex!r}: {_UNSUPPORTED[op]} are not supported")
    return stripped


def describe_regex_error(regex: str, backend_error: Exception) -> ValueError:
    """A ValueError for a regex the backend rejected, with Python's reason when it has one."""
    try:
        re.compile(regex)
    except re.error as e:
        return ValueError(f"invalid regex {regex!r}: {e}")
    return ValueError(f"invalid regex {regex!r}: {backend_error}")


def _strip_outer_anchors(regex: str) -> str:
    try:
        parsed = list(sre_parse.parse(regex))
    except re.error:
        return regex
    if parsed and parsed[0] == (sre_parse.AT, sre_parse.AT_BEGINNING) and regex.startswith("^"):
        regex, parsed = regex[1:], parsed[1:]
    if parsed and parsed[-1] == (sre_parse.AT, sre_parse.AT_END) and regex.endswith("$"):
        regex = regex[:-1]
    return regex


def _walk_ops(parsed: Any):
    for op, av in parsed:
        yield op
        for child in _children(av):
            yield from _walk_ops(child)


def _children(av: Any) -> list:
    if isinstance(av, sre_parse.SubPattern):
        return [av]
    if isinstance(av, (tuple, list)):
        found = []
        for item in av:
            found.extend(_children(item))
        return found
    return []


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from e
