"""The interface every tool-call format implements: parse whole text, parse a stream, and the
regex of a call (for constrained decoding).

A format's file defines one ``ToolParser`` subclass registered under its name. Parsers are pure
text functions: they know nothing about requests, tokenizers or HTTP.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

TOOL_PARSERS: dict[str, type[ToolParser]] = {}


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the function's name and its arguments as compact JSON text."""

    name: str
    arguments: str


@dataclass
class ParseResult:
    """A whole output split into the text outside the calls and the calls, in order."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)


@dataclass
class CallDelta:
    """A piece of the ``index``-th call of a stream: its name (first delta only) and/or a piece
    of its arguments' JSON text. Joining a call's ``arguments`` pieces gives its arguments."""

    index: int
    name: str | None = None
    arguments: str = ""


@dataclass
class StreamDelta:
    """What one fed piece of text adds: plain content and call pieces."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.calls)


class StreamParser(ABC):
    """Incremental parser for one output. Text that may be the start of a call is held back
    until it is known not to be one; no call syntax ever appears in ``content``."""

    @abstractmethod
    def feed(self, text: str) -> StreamDelta:
        """Consume the next piece of output text."""

    @abstractmethod
    def finish(self) -> StreamDelta:
        """The output ended: flush what was held back (an unfinished call becomes content)."""


class ToolParser(ABC):
    """One tool-call format."""

    name: ClassVar[str]
    # NOTE: the text that opens a call, or None when calls have no opening tag (then free text
    # and calls cannot be told apart by a grammar, and ``auto`` stays unconstrained).
    trigger: ClassVar[str | None] = None

    @abstractmethod
    def parse(self, text: str) -> ParseResult:
        """Split a whole output. Malformed calls stay in ``content`` as text."""

    @abstractmethod
    def stream(self) -> StreamParser:
        """A fresh incremental parser for one output."""

    def call_regex(self, name: str, arguments_regex: str) -> str | None:
        """The regex of one call of function ``name`` whose arguments match ``arguments_regex``
        (compact JSON), or None when this format cannot be constrained by a grammar."""
        return None

    def calls_regex(self, one_call: str, parallel: bool) -> str | None:
        """The regex of a whole output of calls, each matching ``one_call``: exactly one call,
        or one or more when ``parallel``."""
        return None


def register_tool_parser(name: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
    def wrap(cls: type[ToolParser]) -> type[ToolParser]:
        cls.name = name
        TOOL_PARSERS[name] = cls
        return cls

    return wrap


def compact_json(value: object) -> str:
    """Arguments as OpenAI returns them: JSON text (compact, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
