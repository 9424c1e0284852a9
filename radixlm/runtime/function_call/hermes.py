"""Hermes / Qwen2.5 calls: ``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``,
one block per call."""

from __future__ import annotations

from typing import ClassVar

from radixlm.runtime.constrained.specs import escape_literal
from radixlm.runtime.function_call.base import TOOL_PARSERS, register_tool_parser
from radixlm.runtime.function_call.json_calls import call_from_text, json_call_regex
from radixlm.runtime.function_call.scanning import (
    NEED_MORE,
    Scan,
    ScanningToolParser,
    View,
    text_until,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


@register_tool_parser("hermes")
class HermesParser(ScanningToolParser):
    """Each call is a JSON object between ``<tool_call>`` and ``</tool_call>``."""

    trigger = OPEN
    # NOTE: what is written between parallel calls (Qwen's templates: a newline)
    separator: ClassVar[str] = "\n"

    def scan(self, view: View) -> Scan:
        buf = view.text
        if not buf.startswith(OPEN):
            return text_until(view, OPEN)
        close = buf.find(CLOSE, len(OPEN))
        reopen = buf.find(OPEN, len(OPEN), None if close < 0 else close)
        if reopen > 0:
            return buf[:reopen], reopen
        if close < 0:
            return (buf, len(buf)) if view.final else NEED_MORE
        end = close + len(CLOSE)
        call = call_from_text(buf[len(OPEN) : close])
        return ([call], end) if call else (buf[:end], end)

    def call_regex(self, name: str, arguments_regex: str) -> str:
        return json_call_regex(name, arguments_regex, "arguments")

    def calls_regex(self, one_call: str, parallel: bool) -> str:
        block = f"<tool_call>\\n(?:{one_call})\\n</tool_call>"
        if not parallel:
            return block
        # NOTE: the output may end after any call, right after its `</tool_call>`. One copy of
        # the call regex: repeating the block as `B(?:\nB)*` doubles the automaton and made
        # outlines compile 5x slower.
        sep = escape_literal(self.separator).replace("\n", "\\n")
        sep = f"(?:{sep})?" if sep else ""
        return f"(?:{block}{sep})+"


# NOTE: SGLang's names of this format (its qwen25 parser, renamed qwen)
TOOL_PARSERS["qwen25"] = TOOL_PARSERS["qwen"] = HermesParser


@register_tool_parser("builtin")
class BuiltinParser(HermesParser):
    """The format the built-in tool prompt asks for (chat templates without tool support):
    hermes calls written back to back. Measured on SmolLM2-135M with ``tool_choice: required``
    and parallel calls: with a newline allowed between calls it wrote call after call until
    ``max_tokens`` in 10 of 26 answers; back to back, it ended after its calls in 26 of 26."""

    separator = ""
