"""Regexes for JSON integers and numbers within bounds (for backends that ignore bounds).

No side is unbounded: at most ``MAX_DIGITS`` integer and fraction digits, so that a model cannot
loop inside a number.

Integer ranges are exact. Number ranges are sound but not complete: every match lies within the
bounds, but exponents are never produced, and a fraction is only produced where the whole unit
interval ``[n, n + 1)`` (or ``(-(n + 1), -n]``) fits inside the bounds.
"""

from __future__ import annotations

import math

MAX_DIGITS = 16  # integer and fraction digits; a double holds 17 significant digits, more is noise
MAX_MAGNITUDE = 10**MAX_DIGITS - 1
FRACTION = rf"\.[0-9]{{1,{MAX_DIGITS}}}"


def integer_range_regex(lo: int | None, hi: int | None) -> str:
    """A regex for the JSON integers ``n`` with ``lo <= n <= hi`` (None: unbounded)."""
    parts = []
    if lo is None or lo < 0:
        neg_lo = 1 if hi is None else max(1, -hi)
        neg_hi = None if lo is None else -lo
        if neg_hi is None or neg_lo <= neg_hi:
            parts.append("-" + _group(_natural_range(neg_lo, neg_hi)))
    if hi is None or hi >= 0:
        pos_lo = 0 if lo is None else max(0, lo)
        if hi is None or pos_lo <= hi:
            parts.append(_natural_range(pos_lo, hi))
    if not parts:
        raise ValueError(f"no integer satisfies the bounds [{lo}, {hi}]")
    return _alternation(parts)


def number_range_regex(
    lo: float | None, hi: float | None, lo_exclusive: bool = False, hi_exclusive: bool = False
) -> str:
    """A regex for JSON numbers within the bounds (exclusive where flagged); see module doc."""
    int_lo = None if lo is None else int_at_or_above(lo, lo_exclusive)
    int_hi = None if hi is None else int_at_or_below(hi, hi_exclusive)
    parts = []
    if int_lo is None or int_hi is None or int_lo <= int_hi:
        parts.append(integer_range_regex(int_lo, int_hi))
    pos_lo = 0 if int_lo is None else max(0, int_lo)
    pos_hi = None if hi is None else math.floor(hi) - 1
    if pos_hi is None or pos_lo <= pos_hi:
        parts.append(_group(_natural_range(pos_lo, pos_hi)) + FRACTION)
    neg_lo = 0 if hi is None else max(0, int_at_or_above(-hi, hi_exclusive))
    neg_hi = None if lo is None else math.floor(-lo) - 1
    if neg_hi is None or neg_lo <= neg_hi:
        parts.append("-" + _group(_natural_range(neg_lo, neg_hi)) + FRACTION)
    if not parts:
        raise ValueError(f"no number satisfies the bounds [{lo}, {hi}]")
    return _alternation(parts)


def int_at_or_above(x: float, exclusive: bool) -> int:
    """The least integer ``>= x`` (``> x`` when ``exclusive``)."""
    n = math.ceil(x)
    return n + 1 if exclusive and n == x else n


def int_at_or_below(x: float, exclusive: bool) -> int:
    """The greatest integer ``<= x`` (``< x`` when ``exclusive``)."""
    n = math.floor(x)
    return n - 1 if exclusive and n == x else n


def _natural_range(lo: int, hi: int | None) -> str:
    """Non-negative integers in ``[lo, hi]`` written without leading zeros."""
    if hi is None:  # NOTE: at most MAX_DIGITS digits, written compactly
        digits = len(str(lo))
        if digits >= MAX_DIGITS:
            return _natural_range(lo, MAX_MAGNITUDE)
        longer = f"[1-9][0-9]{{{digits},{MAX_DIGITS - 1}}}"
        return _alternation([_natural_range(lo, 10**digits - 1), longer])
    parts = []
    while len(str(lo)) < len(str(hi)):
        top = 10 ** len(str(lo)) - 1
        parts.extend(_same_length(str(lo), str(top)))
        lo = top + 1
    parts.extend(_same_length(str(lo), str(hi)))
    return _alternation(parts)


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching the digit strings in ``[lo, hi]``, both of the same length."""
    if lo == hi:
        return [lo]
    if len(lo) == 1:
        return [f"[{lo}-{hi}]"]
    if lo[0] == hi[0]:
        return [lo[0] + _group(_alternation(_same_length(lo[1:], hi[1:])))]
    rest = len(lo) - 1
    parts, first, last = [], int(lo[0]), int(hi[0])
    if lo[1:] != "0" * rest:
        parts.append(lo[0] + _group(_alternation(_same_length(lo[1:], "9" * rest))))
        first += 1
    tail = []
    if hi[1:] != "9" * rest:
        tail.append(hi[0] + _group(_alternation(_same_length("0" * rest, hi[1:]))))
        last -= 1
    if first <= last:
        parts.append(f"{_digit_class(first, last)}[0-9]{{{rest}}}")
    return parts + tail


def _digit_class(first: int, last: int) -> str:
    return str(first) if first == last else f"[{first}-{last}]"


def _alternation(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def _group(regex: str) -> str:
    return regex if regex.startswith("(?:") and _balanced_outer(regex) else f"(?:{regex})"


def _balanced_outer(regex: str) -> bool:
    depth = 0
    for i, ch in enumerate(regex):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(regex) - 1:
            return False
    return True
