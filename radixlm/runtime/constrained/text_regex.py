"""Regexes over free text, valid in Python ``re`` and in the Rust regex syntax of the grammar
backends (no lookaround)."""

from __future__ import annotations

from radixlm.runtime.constrained.specs import escape_literal

_CLASS_META = set("\\]^-[&~")


def text_without(tag: str) -> str:
    """A regex matching exactly the strings (newlines included) that do not contain ``tag``.

    Every occurrence of ``tag[0]`` opens a run that must part from ``tag`` before it ends:
    ``tag[:j]`` followed by nothing or by a character other than ``tag[j]`` (and ``tag[0]``).
    This needs ``tag[0]`` to occur only once in ``tag``.
    """
    if not tag:
        raise ValueError("text_without needs a non-empty tag")
    first = tag[0]
    if first in tag[1:]:
        raise ValueError(f"text_without needs a tag whose first character occurs once: {tag!r}")
    free = f"[^{_class_char(first)}]*"
    runs = [
        f"{escape_literal(tag[:j])}(?:[^{_class_char(first)}{_class_char(tag[j])}]{free})?"
        for j in range(1, len(tag))
    ]
    if not runs:
        return free
    return f"{free}(?:{'|'.join(runs)})*"


def _class_char(char: str) -> str:
    """``char`` written inside a character class."""
    return "\\" + char if char in _CLASS_META else char
