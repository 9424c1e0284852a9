"""Size limits checked before a compile starts, so an oversized spec fails at once, by name.

They are cheap (one ``sre_parse`` pass) and catch only the obvious cases: a huge spec, or counted
repetitions (``a{100000}``, ``(a{1,100}){1,100}``) that unroll into more automaton positions than
a DFA index can hold. Specs that blow up in subtler ways (``(a|b)*a(a|b){16}``) are stopped by
the compile deadline and the worker's memory cap instead (``compile_pool.py``).
"""

from __future__ import annotations

import re
from typing import Any

try:
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

MAX_SPEC_CHARS = 100_000
MAX_REGEX_POSITIONS = 50_000
_ONE_POSITION = {
    sre_parse.LITERAL,
    sre_parse.NOT_LITERAL,
    sre_parse.ANY,
    sre_parse.IN,
    sre_parse.CATEGORY,
}
_REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT}


def check_spec_size(kind: str, spec: str) -> None:
    """ValueError if the spec text is longer than ``MAX_SPEC_CHARS``."""
    if len(spec) > MAX_SPEC_CHARS:
        raise ValueError(
            f"the {kind} spec is {len(spec)} characters long; at most {MAX_SPEC_CHARS} are allowed"
        )


def check_regex_size(regex: str) -> None:
    """ValueError if counted repetitions unroll ``regex`` past ``MAX_REGEX_POSITIONS``."""
    positions = regex_positions(regex)
    if positions is not None and positions > MAX_REGEX_POSITIONS:
        raise ValueError(
            f"counted repetitions ({{n}}, {{n,m}}) unroll the regex to {positions} positions; "
            f"at most {MAX_REGEX_POSITIONS} are allowed"
        )


def regex_positions(regex: str) -> int | None:
    """Characters the regex's automaton tracks once every ``{n,m}`` is written out (``x*`` and
    ``x+`` count once); None when Python cannot parse it (the backend judges it then)."""
    try:
        return _positions(sre_parse.parse(regex))
    except (re.error, RecursionError, OverflowError):
        return None


def _positions(pattern: Any) -> int:
    total = 0
    for op, av in pattern:
        if op in _ONE_POSITION:
            total += 1
        elif op is sre_parse.SUBPATTERN:
            total += _positions(av[-1])
        elif op is sre_parse.BRANCH:
            total += sum(_positions(branch) for branch in av[1])
        elif op in _REPEATS:
            low, high, body = av
            total += _positions(body) * (max(low, 1) if high == sre_parse.MAXREPEAT else high)
    return total
