"""Pythonic calls (Llama 3.2 / Llama 4): the output opens with a Python list of calls,
``[get_weather(city="Paris", unit="c"), f2(a=1)]``, keyword arguments with literal values."""

from __future__ import annotations

import ast
import math
import re

from radixlm.runtime.function_call.base import ToolCall, compact_json, register_tool_parser
from radixlm.runtime.function_call.scanning import (
    NEED_MORE,
    Scan,
    ScanningToolParser,
    View,
    skip_space,
)

_HEAD = re.compile(r"\[\s*(?:[A-Za-z_]\w*\s*(\()?)?")
_NAMED_CONSTANTS = {"true": True, "false": False, "null": None}


@register_tool_parser("pythonic")
class PythonicParser(ScanningToolParser):
    """A list of calls opening the output; everything else is text. Output opening with
    ``[name(`` is held back until its list closes."""

    # NOTE: no opening tag, so a grammar cannot tell text from a call.
    trigger = None

    def scan(self, view: View) -> Scan:
        buf = view.text
        if view.at_start:
            space = skip_space(buf, 0)
            if space:
                return buf[:space], space
            if _may_be_calls(buf):
                end = view.bracket_end(0, python=True)
                if end is None:
                    return (buf, len(buf)) if view.final else NEED_MORE
                calls = parse_calls(buf[:end])
                return (calls, end) if calls else (buf[:end], end)
        return buf, len(buf)


def _may_be_calls(buf: str) -> bool:
    """Whether ``buf`` opens like ``[name(`` or could still become so."""
    head = _HEAD.match(buf)
    return head is not None and (head.group(1) is not None or head.end() == len(buf))


def parse_calls(source: str) -> list[ToolCall]:
    """The calls of a Python list expression of calls; empty when it is anything else."""
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return []
    calls = [_call(node) for node in tree.body.elts]
    return calls if all(calls) else []


def _call(node: ast.expr) -> ToolCall | None:
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
        return None
    try:
        arguments = {_keyword(kw): _literal(kw.value) for kw in node.keywords}
    except ValueError:
        return None
    return ToolCall(node.func.id, compact_json(arguments))


def _keyword(keyword: ast.keyword) -> str:
    if keyword.arg is None:
        raise ValueError("**arguments are not literal")
    return keyword.arg


def _literal(node: ast.expr) -> object:
    """A literal's value: strings, finite numbers, booleans, None (or true/false/null),
    lists, tuples and dicts of literals with string keys. Raises ValueError otherwise."""
    if isinstance(node, ast.Name) and node.id in _NAMED_CONSTANTS:
        return _NAMED_CONSTANTS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Dict):
        return {_string(key): _literal(value) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("a sign needs a number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant) and _is_scalar(node.value):
        return node.value
    raise ValueError("not a literal")


def _is_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (str, int, bool))


def _string(node: ast.expr | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    raise ValueError("dict keys must be strings")
