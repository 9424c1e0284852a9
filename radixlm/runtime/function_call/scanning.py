"""One loop for whole-text parsing and streaming, so the two always agree.

A format only says how to cut the front of its buffer (``scan``): some text, some calls, or
"need more text". ``parse`` runs the loop over the whole output at once; ``stream`` runs it on
each fed piece. A scan must decide only what no later text can change, which makes the result
independent of how the output is split into pieces.
"""

from __future__ import annotations

import re
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from radixlm.runtime.function_call.base import (
    CallDelta,
    ParseResult,
    StreamDelta,
    StreamParser,
    ToolCall,
    ToolParser,
)

Event = str | list[ToolCall]
Scan = tuple[Event | None, int]

NEED_MORE: Scan = (None, 0)

_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(")?|[\[\]{}()]', re.DOTALL)
_PYTHON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*(")?|\'(?:[^\'\\]|\\.)*(\')?|[\[\]{}()]', re.DOTALL)


@dataclass
class View:
    """The unconsumed output as a scanner sees it: ``text``; ``final``: no more text comes;
    ``at_start``: only whitespace precedes ``text`` in the output."""

    text: str
    final: bool = False
    at_start: bool = True
    # NOTE: per (start, python): where a bracket scan stopped, its depth, and its end once found;
    # ``text`` only grows while a view lives, so a scan resumes instead of starting over.
    _brackets: dict[tuple[int, bool], tuple[int, int, int | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def bracket_end(self, start: int, python: bool = False) -> int | None:
        """The end of the bracketed value opening at ``text[start]`` (JSON, or a Python
        expression when ``python``: single quotes delimit strings too), or None when it is not
        closed yet."""
        pos, depth, end = self._brackets.get((start, python), (start, 0, None))
        if end is None:
            pos, depth, end = _scan_brackets(self.text, pos, depth, python)
            self._brackets[(start, python)] = (pos, depth, end)
        return end


def _scan_brackets(text: str, pos: int, depth: int, python: bool) -> tuple[int, int, int | None]:
    token = _PYTHON_TOKEN if python else _JSON_TOKEN
    for match in token.finditer(text, pos):
        char = match.group()[0]
        if char in "\"'":
            if match.lastindex is None:
                return match.start(), depth, None
            continue
        depth += 1 if char in "[{(" else -1
        if depth == 0:
            return match.end(), depth, match.end()
    return len(text), depth, None


class ScanningToolParser(ToolParser):
    """A format defined by its ``scan``; ``parse`` and ``stream`` come from it."""

    @abstractmethod
    def scan(self, view: View) -> Scan:
        """Cut the front of non-empty ``view.text``: ``(text, n)`` or ``(calls, n)`` consuming
        ``n`` characters, or ``NEED_MORE`` (never when ``view.final``)."""

    def parse(self, text: str) -> ParseResult:
        stream = self.stream()
        return merge_deltas([stream.feed(text), stream.finish()])

    def stream(self) -> StreamParser:
        return ScanStream(self.scan)


class ScanStream(StreamParser):
    """Feeds a buffer through a format's scanner; whitespace between calls is dropped."""

    def __init__(self, scan: Callable[[View], Scan]) -> None:
        self._scan = scan
        self._view = View("")
        self._text = _TextTrim()
        self._calls = 0

    def feed(self, text: str) -> StreamDelta:
        self._view.text += text
        return self._advance(final=False)

    def finish(self) -> StreamDelta:
        delta = self._advance(final=True)
        delta.content += self._text.flush()
        return delta

    def _advance(self, final: bool) -> StreamDelta:
        delta = StreamDelta()
        self._view.final = final
        while self._view.text:
            event, used = self._scan(self._view)
            if not used:
                if not final:
                    break
                event, used = self._view.text, len(self._view.text)
            at_start = self._view.at_start and isinstance(event, str) and not event.strip()
            self._view = View(self._view.text[used:], final, at_start)
            self._emit(event, delta)
        return delta

    def _emit(self, event: Event, delta: StreamDelta) -> None:
        if isinstance(event, str):
            delta.content += self._text.add(event)
            return
        self._text.cut()
        for call in event:
            delta.calls.append(CallDelta(self._calls, call.name, call.arguments))
            self._calls += 1


class _TextTrim:
    """Content text without the whitespace that only separates calls: a run of text between
    calls (or before the first, or after the last) is held while it is all whitespace, and
    dropped when a call or the end follows a call."""

    def __init__(self) -> None:
        self._held = ""
        self._blank = True
        self._after_call = False

    def add(self, text: str) -> str:
        if not self._blank:
            return text
        self._held += text
        if not self._held.strip():
            return ""
        self._blank = False
        return self.flush()

    def cut(self) -> None:
        self._held = ""
        self._blank = True
        self._after_call = True

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self._blank and self._after_call else held


def merge_deltas(deltas: Iterable[StreamDelta]) -> ParseResult:
    """Reassemble a stream's deltas into the result ``parse`` gives for the whole text."""
    content: list[str] = []
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        content.append(delta.content)
        for call in delta.calls:
            if call.name is not None:
                names[call.index] = call.name
            arguments.setdefault(call.index, []).append(call.arguments)
    calls = [ToolCall(names[i], "".join(arguments.get(i, []))) for i in sorted(names)]
    return ParseResult("".join(content), calls)


def partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest end of ``buf`` that is a proper beginning of ``tag``."""
    for size in range(min(len(tag) - 1, len(buf)), 0, -1):
        if buf.endswith(tag[:size]):
            return size
    return 0


def text_until(view: View, tag: str) -> Scan:
    """The text before the first ``tag``, holding back an end that may start one. The text
    must not start with ``tag``."""
    buf = view.text
    end = buf.find(tag)
    if end < 0:
        end = len(buf) if view.final else len(buf) - partial_suffix(buf, tag)
    return (buf[:end], end) if end else NEED_MORE


def skip_space(buf: str, pos: int) -> int:
    """The index of the first non-whitespace character at or after ``pos``."""
    while pos < len(buf) and buf[pos].isspace():
        pos += 1
    return pos
