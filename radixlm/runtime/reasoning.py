"""Reasoning blocks (``--reasoning-parser``): split a thinking model's output into its
reasoning (``<think>...</think>``) and the content after it, whole or streamed."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from radixlm.runtime.function_call.scanning import partial_suffix

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}

_HEAD, _REASONING, _CONTENT = "head", "reasoning", "content"


class ReasoningParser:
    """A reasoning format: an optional ``start_tag`` opening the output, reasoning, ``end_tag``,
    content. Newlines right after either tag and right before ``end_tag`` are dropped."""

    name: ClassVar[str]
    start_tag: ClassVar[str] = "<think>"
    end_tag: ClassVar[str] = "</think>"
    # NOTE: True when the chat template already opened the block, so the output starts inside
    # the reasoning and ``start_tag`` may be missing.
    starts_in_reasoning: ClassVar[bool] = False

    def split(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, content)`` of a whole output; reasoning is None when it has none."""
        stream = self.stream()
        reasoning, content = stream.feed(text)
        rest_reasoning, rest_content = stream.finish()
        return (reasoning + rest_reasoning if stream.reasoned else None), content + rest_content

    def stream(self) -> ReasoningStream:
        """A fresh incremental splitter for one output."""
        return ReasoningStream(self.start_tag, self.end_tag, self.starts_in_reasoning)


def register_reasoning_parser(
    name: str,
) -> Callable[[type[ReasoningParser]], type[ReasoningParser]]:
    def wrap(cls: type[ReasoningParser]) -> type[ReasoningParser]:
        cls.name = name
        REASONING_PARSERS[name] = cls
        return cls

    return wrap


@register_reasoning_parser("qwen3")
class Qwen3ReasoningParser(ReasoningParser):
    """The model opens its own ``<think>`` block; output not opening with it is all content."""


@register_reasoning_parser("deepseek-r1")
class DeepSeekR1ReasoningParser(ReasoningParser):
    """The template opened ``<think>``: all output up to ``</think>`` (or all of it, when that
    never comes) is reasoning. A repeated ``<think>`` opening the output is dropped."""

    starts_in_reasoning = True


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The reasoning format registered as ``name``."""
    if name not in REASONING_PARSERS:
        known = ", ".join(sorted(REASONING_PARSERS))
        raise ValueError(f"unknown reasoning_parser {name!r}; known parsers: {known}")
    return REASONING_PARSERS[name]()


class ReasoningStream:
    """Splits one output piece by piece; text that may be part of a tag is held back, so the
    joined pieces always equal ``split`` of the whole output."""

    def __init__(self, start_tag: str, end_tag: str, starts_in_reasoning: bool) -> None:
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._starts_in_reasoning = starts_in_reasoning
        self._state = _HEAD
        self._buf = ""
        self._newlines = ""
        self._lead = True
        self.reasoned = False

    def feed(self, text: str) -> tuple[str, str]:
        """``(reasoning, content)`` this piece adds."""
        self._buf += text
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        """The output ended: ``(reasoning, content)`` still held back."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> tuple[str, str]:
        reasoning = content = ""
        if self._state == _HEAD:
            self._read_head(final)
        if self._state == _REASONING:
            reasoning = self._read_reasoning(final)
        if self._state == _CONTENT:
            content = self._read_content()
        return reasoning, content

    def _read_head(self, final: bool) -> None:
        head = self._buf.lstrip()
        if not final and len(head) < len(self._start_tag) and self._start_tag.startswith(head):
            return
        if head.startswith(self._start_tag):
            self._buf = head[len(self._start_tag) :]
            self._state = _REASONING
        elif self._starts_in_reasoning:
            self._state = _REASONING
        else:
            self._state, self._lead = _CONTENT, False
        self.reasoned = self._state == _REASONING

    def _read_reasoning(self, final: bool) -> str:
        end = self._buf.find(self._end_tag)
        if end >= 0:
            piece = self._trimmed(self._buf[:end])
            self._buf = self._buf[end + len(self._end_tag) :]
            self._state, self._lead, self._newlines = _CONTENT, True, ""
            return piece
        keep = 0 if final else partial_suffix(self._buf, self._end_tag)
        piece = self._trimmed(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return piece

    def _trimmed(self, piece: str) -> str:
        """Reasoning without its leading and (held back) trailing newlines."""
        if self._lead:
            piece = piece.lstrip("\n")
            if not piece:
                return ""
            self._lead = False
        piece = self._newlines + piece
        body = piece.rstrip("\n")
        self._newlines = piece[len(body) :]
        return body

    def _read_content(self) -> str:
        text, self._buf = self._buf, ""
        if self._lead:
            text = text.lstrip("\n")
            self._lead = not text
        return text
